"""The session's background checks (tests/conftest.py): each runs in a session of its own at the lowest CPU priority,
a check not given at the start runs when asked, and a check that fails shows its exit status and error output to the
test that reads it."""
from __future__ import annotations

import pytest

from check_script import Check
from conftest import CHECK_NICE, BackgroundChecks

# prints its session, its process and its autogroup's nice (with WAIT_NICE, once the runner has set it: up to 10 s),
# then exits EXIT
PROBE = """import json, os, sys, time
deadline = time.monotonic() + (10 if os.environ.get('WAIT_NICE') else 0)
while True:
    nice = int(open('/proc/self/autogroup').read().split()[-1])  # "/autogroup-123 nice 19"
    if nice or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps({'sid': os.getsid(0), 'pid': os.getpid(), 'nice': nice}))
print('the probe says why', file=sys.stderr)
sys.exit(int(os.environ.get('EXIT', '0')))
"""


def test_checks_run_in_sessions_of_their_own_at_the_lowest_priority_and_a_failure_shows_its_error(tmp_path):
    script = tmp_path / "probe_check.py"
    script.write_text(PROBE)
    made = []

    def make(name: str) -> Check:
        made.append(name)
        return Check(str(script))

    checks = BackgroundChecks({"first": Check(str(script), env={"WAIT_NICE": "1"}),
                               "failing": Check(str(script), env={"EXIT": "3"})}, make)
    try:
        first = checks.result("first")
        assert first["sid"] == first["pid"] and first["nice"] == CHECK_NICE
        with pytest.raises(AssertionError, match=r"probe_check.py exited 3:\n.*the probe says why"):
            checks.result("failing")
        assert checks.result("asked_later")["sid"] and made == ["asked_later"]  # not given: made when asked
    finally:
        checks.close()
