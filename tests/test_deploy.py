"""`python -m endpoint.deploy` with the real boto3 client against moto's server on loopback.

moto's server answers CreateModel, CreateEndpointConfig, CreateEndpoint, Describe*, Delete* and
Application Auto Scaling. Two things it does not do, and how the tests stand in:
- Its endpoints are InService at once and never fail: `lifecycle` sets the emulated endpoint's
  status (and FailureReason) before each DescribeEndpoint the tool sends, in the order a real
  endpoint goes through them; the tool reads them back through the API.
- It has no UpdateEndpoint (moto 5.2.5): the tests take that one request out of the client
  (botocore's before-call hook), check what the tool built, and apply SageMaker's effect to the
  emulated endpoint (or not, for a rolled-back update).
"""
from __future__ import annotations

import io
import json
import re

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from conftest import PLANTED_SECRET
from endpoint import deploy

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/lmi-fp8-moe:test"
ROLE = "arn:aws:iam::123456789012:role/sagemaker-exec"
FILE_SECRET = "hf_FILEsecretVALUE456"


@pytest.fixture(scope="module")
def aws(moto_env):
    return {s: boto3.client(s) for s in ("sagemaker", "application-autoscaling")}


def emulated(name: str):
    """moto's record of an endpoint (the server runs in this process); None if there is none."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    return sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].endpoints.get(name)


def session(lifecycle: dict | None = None, on_update=None) -> boto3.Session:
    """A boto3 session whose clients talk to moto; lifecycle: endpoint -> statuses (or (status, reason), or
    None: as it is), one applied before each DescribeEndpoint; on_update(params) answers UpdateEndpoint."""
    s = boto3.Session()
    steps = {k: list(v) for k, v in (lifecycle or {}).items()}

    def before_describe(params, **_):
        name = params["EndpointName"]
        if steps.get(name) and emulated(name):
            step = steps[name].pop(0)
            if step is not None:
                status, reason = (step, None) if isinstance(step, str) else step
                ep = emulated(name)
                ep.endpoint_status, ep.failure_reason = status, reason

    s.events.register("provide-client-params.sagemaker.DescribeEndpoint", before_describe)
    if on_update:
        sent = []

        def capture(params, **_):
            sent.append(dict(params))
            on_update(dict(params))

        def answer(**_):  # short-circuits the call: moto has no UpdateEndpoint
            return AWSResponse("http://moto", 200, {}, None), {"EndpointArn": emulated(sent[-1]["EndpointName"]).arn}

        s.events.register("provide-client-params.sagemaker.UpdateEndpoint", capture)
        s.events.register("before-call.sagemaker.UpdateEndpoint", answer)
    return s


def run(capsys, *argv, sess=None) -> tuple[int, str, str]:
    out = io.StringIO()
    rc = deploy.main([*argv], session=sess or boto3.Session(), out=out)
    return rc, out.getvalue(), capsys.readouterr().err


def base(name: str, *extra: str) -> list[str]:
    return [name, "--image", IMAGE, "--role", ROLE, "--model-data", "s3://models/qwen3-fp8", "--poll-seconds", "0",
            "--instance-type", "ml.g4dn.12xlarge", *extra]


SCALING = ("--min-instances", "1", "--max-instances", "3", "--scale-target", "8")


@pytest.fixture
def props(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", PLANTED_SECRET)
    p = tmp_path / "serving.properties"
    p.write_text(f"engine=Python\noption.max_model_len=4096\noption.tensor_parallel_degree=max\n"
                 f"option.hf_token={FILE_SECRET}\n")
    return str(p)


def test_create_waits_with_progress_then_attaches_autoscaling(aws, props, capsys):
    rc, out, err = run(capsys, "create", *base("ep-create", "--properties", props, "-o", "max_rolling_batch_size=8",
                                                "--secret-env", "HF_TOKEN", *SCALING),
                       sess=session({"ep-create": ["Creating", "Creating", "InService"]}))
    assert rc == 0, err
    statuses = re.findall(r"^\[\s*\d+:\d\d\] ep-create: (\w+)$", out, re.M)
    assert statuses == ["Creating", "InService"], out
    assert PLANTED_SECRET not in out + err and FILE_SECRET not in out + err
    assert "env OPTION_HF_TOKEN=****  [env HF_TOKEN]" in out

    ep = aws["sagemaker"].describe_endpoint(EndpointName="ep-create")
    config = aws["sagemaker"].describe_endpoint_config(EndpointConfigName=ep["EndpointConfigName"])
    (variant,) = config["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g4dn.12xlarge" and variant["InitialInstanceCount"] == 1
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 3600
    assert variant["ModelDataDownloadTimeoutInSeconds"] == 3600
    assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"  # driver 580 for CUDA 13
    model = aws["sagemaker"].describe_model(ModelName=variant["ModelName"])
    assert model["ExecutionRoleArn"] == ROLE
    container = model["PrimaryContainer"]
    assert container["Image"] == IMAGE
    # names from the settings table: aliases become the canonical key; the flag beats the file
    assert container["Environment"] == {
        "OPTION_ENGINE": "Python", "OPTION_MAX_MODEL_LEN": "4096", "OPTION_TENSOR_PARALLEL_SIZE": "max",
        "OPTION_HF_TOKEN": PLANTED_SECRET, "OPTION_MAX_NUM_SEQS": "8"}
    assert container["ModelDataSource"] == {"S3DataSource": {
        "S3Uri": "s3://models/qwen3-fp8/", "S3DataType": "S3Prefix", "CompressionType": "None"}}

    rid = "endpoint/ep-create/variant/AllTraffic"
    (target,) = aws["application-autoscaling"].describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[rid])["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 3)
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    (policy,) = aws["application-autoscaling"].describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=rid)["ScalingPolicies"]
    tt = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tt["TargetValue"] == 8
    assert tt["PredefinedMetricSpecification"]["PredefinedMetricType"] == \
        "SageMakerVariantConcurrentRequestsPerModelHighResolution"


def test_failed_endpoint_exits_with_its_failure_reason(aws, capsys):
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    rc, out, err = run(capsys, "create", *base("ep-fails"),
                       sess=session({"ep-fails": ["Creating", ("Failed", reason)]}))
    assert rc == 1
    assert reason in err and "/aws/sagemaker/Endpoints/ep-fails" in err
    assert re.search(r"ep-fails: Failed$", out, re.M)


def test_refused_request_leaves_nothing_behind(aws, capsys):
    rc, out, err = run(capsys, "create", *base("ep-refused", "--instance-type", "ml.nonsense.xlarge"))
    assert rc == 1 and "CreateEndpointConfig failed: ValidationException" in err and "ml.nonsense.xlarge" in err
    assert "DeleteModel ModelName=ep-refused-" in out
    assert not [m for m in aws["sagemaker"].list_models(MaxResults=100)["Models"]
                if m["ModelName"].startswith("ep-refused")]


def test_create_refuses_an_existing_endpoint(aws, capsys):
    assert run(capsys, "create", *base("ep-twice"))[0] == 0
    models = len(aws["sagemaker"].list_models(MaxResults=100)["Models"])
    rc, _, err = run(capsys, "create", *base("ep-twice"))
    assert rc == 1 and "endpoint ep-twice exists; use `update`" in err
    assert len(aws["sagemaker"].list_models(MaxResults=100)["Models"]) == models  # nothing made


def _scaling(aws, name):
    return aws["application-autoscaling"].describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[f"endpoint/{name}/variant/AllTraffic"])["ScalableTargets"]


def test_update_deploys_a_new_config_and_removes_the_old(aws, capsys):
    assert run(capsys, "create", *base("ep-upd", *SCALING))[0] == 0
    old = aws["sagemaker"].describe_endpoint(EndpointName="ep-upd")["EndpointConfigName"]
    old_model = aws["sagemaker"].describe_endpoint_config(EndpointConfigName=old)["ProductionVariants"][0]["ModelName"]
    sent = []

    def apply(params):  # what SageMaker does: the endpoint moves to the new config
        sent.append(params)
        emulated(params["EndpointName"]).endpoint_config_name = params["EndpointConfigName"]

    rc, out, err = run(capsys, "update", *base("ep-upd", "-o", "max_model_len=8192", "--min-instances", "1",
                                               "--max-instances", "5", "--scale-target", "8"),
                       sess=session({"ep-upd": [None, "Updating", "Updating", "InService"]}, on_update=apply))
    assert rc == 0, err
    new = aws["sagemaker"].describe_endpoint(EndpointName="ep-upd")["EndpointConfigName"]
    assert new != old and new.startswith("ep-upd-")
    assert sent == [{"EndpointName": "ep-upd", "EndpointConfigName": new}]
    assert re.findall(r"ep-upd: (\w+)$", out, re.M) == ["Updating", "InService"]
    variant = aws["sagemaker"].describe_endpoint_config(EndpointConfigName=new)["ProductionVariants"][0]
    env = aws["sagemaker"].describe_model(ModelName=variant["ModelName"])["PrimaryContainer"]["Environment"]
    assert env == {"OPTION_MAX_MODEL_LEN": "8192"}
    names = {c["EndpointConfigName"] for c in aws["sagemaker"].list_endpoint_configs(MaxResults=100)["EndpointConfigs"]}
    models = {m["ModelName"] for m in aws["sagemaker"].list_models(MaxResults=100)["Models"]}
    assert old not in names and old_model not in models and variant["ModelName"] in models
    (target,) = _scaling(aws, "ep-upd")
    assert target["MaxCapacity"] == 5
    # deregistered before UpdateEndpoint (SageMaker refuses an instance-type change otherwise), then back
    assert out.index("DeregisterScalableTarget") < out.index("UpdateEndpoint") < out.index("RegisterScalableTarget")


def test_rolled_back_update_reports_the_reason_and_keeps_the_old_config(aws, capsys):
    assert run(capsys, "create", *base("ep-rollback"))[0] == 0
    old = aws["sagemaker"].describe_endpoint(EndpointName="ep-rollback")["EndpointConfigName"]
    reason = "Request to service failed. If failure persists after retry, contact customer support."
    rc, out, err = run(capsys, "update", *base("ep-rollback"),
                       sess=session({"ep-rollback": [None, "Updating", ("InService", reason)]}, on_update=lambda p: None))
    assert rc == 1
    assert "update of ep-rollback failed: " + reason in err and f"is InService on {old}" in err
    configs = [c["EndpointConfigName"] for c in aws["sagemaker"].list_endpoint_configs(
        NameContains="ep-rollback", MaxResults=100)["EndpointConfigs"]]
    assert configs == [old]  # the unused new config (and its model) are removed


def test_update_of_a_missing_endpoint_is_a_clear_error(aws, capsys):
    rc, _, err = run(capsys, "update", *base("ep-none"))
    assert rc == 1 and "endpoint ep-none does not exist; use `create`" in err


def test_delete_removes_endpoint_config_model_and_autoscaling(aws, capsys):
    assert run(capsys, "create", *base("ep-del", *SCALING))[0] == 0
    config = aws["sagemaker"].describe_endpoint(EndpointName="ep-del")["EndpointConfigName"]
    model = aws["sagemaker"].describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]["ModelName"]
    rc, out, err = run(capsys, "delete", "ep-del", "--poll-seconds", "0")
    assert rc == 0, err
    assert re.search(r"ep-del: deleted$", out, re.M)
    assert not aws["sagemaker"].list_endpoints(NameContains="ep-del")["Endpoints"]
    assert not aws["sagemaker"].list_endpoint_configs(NameContains="ep-del")["EndpointConfigs"]
    assert model not in {m["ModelName"] for m in aws["sagemaker"].list_models(MaxResults=100)["Models"]}
    assert not _scaling(aws, "ep-del")
    rc, _, err = run(capsys, "delete", "ep-del")
    assert rc == 1 and "endpoint ep-del does not exist" in err


def test_dry_run_prints_the_requests_a_real_run_sends(aws, props, capsys, monkeypatch):
    """Same arguments, dry and real: the printed requests are the ones boto3 is then given, secrets masked."""
    monkeypatch.setattr(deploy, "stamp_now", lambda: "20261201-000000-000")
    args = base("ep-dry", "--properties", props, "--secret-env", "HF_TOKEN", *SCALING)
    models = aws["sagemaker"].list_models(MaxResults=100)["Models"]
    rc, printed, err = run(capsys, "create", *args, "--dry-run", sess=session())
    assert rc == 0, err
    assert aws["sagemaker"].list_models(MaxResults=100)["Models"] == models  # nothing sent
    assert PLANTED_SECRET not in printed and FILE_SECRET not in printed
    dry = [(m.group(1), json.loads(m.group(2))) for m in
           re.finditer(r"^[a-z-]+ (\w+)\n(\{.*?^\})$", printed, re.M | re.S)]

    sent = []
    real = session()
    for svc in ("sagemaker", "application-auto-scaling"):
        real.events.register(f"provide-client-params.{svc}.*",
                             lambda params, model, **kw: sent.append((model.name, dict(params))))
    assert run(capsys, "create", *args, sess=real)[0] == 0
    changes = [(op, p) for op, p in sent if not op.startswith("Describe")]
    for op, p in changes:
        env = p.get("PrimaryContainer", {}).get("Environment", {})
        assert env.get("OPTION_HF_TOKEN", PLANTED_SECRET) == PLANTED_SECRET  # the real value is sent
        for k in env:
            if k == "OPTION_HF_TOKEN":
                env[k] = "****"
    assert [op for op, _ in dry] == ["CreateModel", "CreateEndpointConfig", "CreateEndpoint",
                                     "RegisterScalableTarget", "PutScalingPolicy"]
    assert dry == changes


def test_dry_run_of_update_and_delete(capsys):
    rc, out, _ = run(capsys, "update", *base("ep-x", *SCALING), "--dry-run")
    assert rc == 0
    ops = re.findall(r"^[a-z-]+ (\w+)$", out, re.M)
    assert ops == ["DeleteScalingPolicy", "DeregisterScalableTarget", "CreateModel", "CreateEndpointConfig",
                   "UpdateEndpoint", "RegisterScalableTarget", "PutScalingPolicy", "DeleteEndpointConfig",
                   "DeleteModel"]
    rc, out, _ = run(capsys, "delete", "ep-x", "--dry-run")
    assert rc == 0
    assert re.findall(r"^[a-z-]+ (\w+)$", out, re.M) == ["DeleteScalingPolicy", "DeregisterScalableTarget",
                                                          "DeleteEndpoint", "DeleteEndpointConfig", "DeleteModel"]


@pytest.mark.parametrize("extra, rc, message", [
    (["-o", "max_model_len=lots"], 2, "max_model_len from -o max_model_len: 'lots' is not an integer"),
    (["-o", "trust_remote_code=maybe"], 2, "trust_remote_code from -o trust_remote_code: 'maybe' is not a boolean"),
    (["-o", f"hf_token={PLANTED_SECRET}"], 2, "is a secret: a value on the command line shows in ps"),
    (["-o", "port=9000"], 2, "port from -o port: cannot be set on an endpoint"),
    (["-o", "max_model_lenn=4096"], 2, "did you mean: max_model_len"),
    (["--secret-env", "MAX_BATCH_SIZE"], 2, "not the environment name of a secret setting"),
    (["--model-data", "s3://models/qwen.tar.gz"], 1, "an archive; this tool deploys an uncompressed S3 prefix"),
    (["-o", "model_id=Qwen/Qwen3-30B-A3B-FP8"], 1, "both --model-data and model_id are set"),
    (["--min-instances", "2", "--max-instances", "4", "--scale-target", "8"], 1,
     "--instance-count 1 must lie within --min-instances 2 and --max-instances 4"),
    (["--min-instances", "1", "--max-instances", "4"], 1, "autoscaling needs --scale-target"),
])
def test_bad_input_is_a_clear_error_before_any_request(capsys, extra, rc, message):
    got, out, err = run(capsys, "create", *base("ep-bad", *extra), "--dry-run")
    assert got == rc and message in err, err
    assert "CreateModel" not in out and PLANTED_SECRET not in out + err


def test_out_of_range_timeout_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        deploy.main(["create", *base("ep-bad", "--startup-timeout", "7200")])
    assert e.value.code == 2
    assert "7200 is out of range (seconds: 60-3600)" in capsys.readouterr().err


def test_readme_shows_deploy_invoke_and_delete_and_they_run_dry(capsys):
    import shlex
    from pathlib import Path

    from endpoint import invoke

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme[readme.index("## Deploy to SageMaker"):readme.index("<!-- deploy:end -->")]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert [c[:3] + c[3:4] for c in commands if c[2] == "endpoint.deploy"] == [
        ["python", "-m", "endpoint.deploy", "create"], ["python", "-m", "endpoint.deploy", "delete"]]
    invokes = [c for c in commands if c[2] == "endpoint.invoke"]
    assert ["--stream" in c for c in invokes] == [False, True]
    for c in commands:
        if c[2] == "endpoint.deploy":
            rc, out, err = run(capsys, *c[3:], "--dry-run")
            assert rc == 0, err
        else:
            invoke.parser().parse_args(c[3:])
