# Re-attach to servers left running after the bench process was OOM-killed; measure the tensor model.
import json, re, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, ".")
import bench.e2e_bench as e
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
found = {}
for line in ps.splitlines():
    m = re.search(r"--model[ =](\S+).*--port[ =](\d+)", line) or re.search(r"serve (\S+).*--port[ =](\d+)", line)
    if m and "models/" in m.group(1):
        found.setdefault(m.group(1), set()).add(m.group(2))
print(found, flush=True)
class A: pass
a = A(); a.reps = 3; a.waves = 5; a.profile = False; a.in_tokens = 128; a.out_tokens = 128; a.work = Path("/tmp/e2e-work")
results = {"args": {"attach": True, "reps": 3, "waves": 5}, "servers": {}, "models": {}}
def save():
    (out / "e2e.json").write_text(json.dumps(results, indent=1)); (out / "e2e.md").write_text(e.summarize(results))
for m in e.MODELS:
    ports = found.get(f"/root/models/{m.name}") or set()
    arms = {}
    for port in ports:
        host = f"127.0.0.1:{port}"
        try:
            conn, r = e._request(host, "GET", "/ping", timeout=2); ok = r.status == 200; conn.close()
        except OSError:
            ok = False
        if not ok:
            print("not ready", m.name, port, flush=True); continue
        # the image serves LMI /invocations; stock does not
        try:
            conn, r = e._request(host, "POST", "/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 1}}, timeout=30)
            lmi = r.status == 200; conn.close()
        except OSError:
            lmi = False
        arm = "image" if lmi else "stock"
        arms[arm] = e.Server(f"{m.name}.{arm}", m, arm, int(port), None, Path("/dev/null"), time.monotonic())
    print(m.name, {k: v.port for k, v in arms.items()}, flush=True)
    if "stock" in arms and "image" in arms:
        e.measure_model(a, m, arms, 16384, results, save)
        save()
print("ATTACH DONE", flush=True)
