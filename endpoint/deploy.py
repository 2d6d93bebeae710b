"""Create, update and delete a SageMaker real-time endpoint serving this image (boto3).

    python -m endpoint.deploy create my-llm --image URI --role ARN --model-data s3://bucket/model/ \\
        --properties serving.properties -o tensor_parallel_degree=max --secret-env HF_TOKEN
    python -m endpoint.deploy update my-llm ...   # same flags: a new model and config, then UpdateEndpoint
    python -m endpoint.deploy delete my-llm
    ... --dry-run                                # print the exact API requests, send none

Settings reach the container as environment variables named by the settings table
(serving/settings.py): `option.<key>` of the properties file and `-o key=value` become
OPTION_<KEY> of the key's canonical name, which the container reads first. Model files
are an uncompressed S3 prefix (ModelDataSource, CompressionType None) that SageMaker
copies to /opt/ml/model: no tar.gz to build or unpack for a 200+ GB checkpoint.

Why boto3 and not the `sagemaker` SDK: the work is nine API calls whose exact requests
--dry-run prints; the SDK's Model.deploy() makes the same calls but hides them, brings
dozens of dependencies into a tool that otherwise needs boto3 only, and its streaming
LineIterator is the reader that hangs on a last line without a newline.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from dataclasses import dataclass

from serving.resolve import ConfigError
from serving.settings import looks_secret

from .deploy_env import MASK, Environment, build_environment

VARIANT = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
SCALE_METRICS = {
    # requests in flight per model container, reported every 10 s: reacts to LLM load in seconds
    "concurrency": "SageMakerVariantConcurrentRequestsPerModelHighResolution",
    "invocations": "SageMakerVariantInvocationsPerInstance",  # per minute
}
# SageMaker's limits (ProductionVariant): both timeouts 60-3600 s, volume 1-512 GB.
TIMEOUT_RANGE = (60, 3600)
# An FP8 MoE model of a few hundred GB: the S3 copy to the instance and the engine's load,
# compile and CUDA-graph capture each take many minutes, so both default to SageMaker's maximum.
DEFAULT_DOWNLOAD_TIMEOUT = 3600
DEFAULT_STARTUP_TIMEOUT = 3600
# NVIDIA driver 580 / CUDA 13.0 (botocore's model of ProductionVariant.InferenceAmiVersion): the
# driver branch the image's torch 2.13 CUDA 13 wheels need, without forward-compatibility libraries.
DEFAULT_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


class DeployError(Exception):
    """Stops the command; str() says what failed and what to do."""


# -- the requests ---------------------------------------------------------------------------------

@dataclass
class Spec:
    """What create and update deploy."""

    name: str
    image: str
    role: str
    environment: Environment
    model_data: str | None
    instance_type: str
    instance_count: int
    startup_timeout: int
    download_timeout: int
    volume_size: int | None
    inference_ami: str | None = DEFAULT_AMI
    min_instances: int | None = None
    max_instances: int | None = None
    scale_metric: str = "concurrency"
    scale_target: float | None = None

    @property
    def autoscaling(self) -> bool:
        return self.max_instances is not None


def check_name(name: str, what: str = "endpoint name") -> str:
    if not NAME_RE.match(name):
        raise DeployError(f"{what} {name!r}: 1-63 letters, digits and hyphens, starting and ending with a letter "
                          "or digit")
    return name


def check_model_data(url: str) -> str:
    """An uncompressed S3 prefix; SageMaker copies every object under it into /opt/ml/model."""
    from serving.s3 import ARCHIVE_SUFFIXES, S3SourceError, S3Url

    try:
        u = S3Url.parse(url)
    except S3SourceError as e:
        raise DeployError(f"--model-data: {e}") from None
    if u.prefix.lower().endswith(ARCHIVE_SUFFIXES):
        raise DeployError(f"--model-data {url}: an archive; this tool deploys an uncompressed S3 prefix (the folder "
                          "holding config.json and the weights), which SageMaker copies without unpacking")
    return str(u)  # with the trailing slash SageMaker requires for an S3Prefix


def stamp_now() -> str:
    """UTC time to the millisecond: a create and an update in the same second get different names."""
    t = time.time()
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(t)) + f"-{int(t * 1000) % 1000:03d}"


def stamped(name: str, stamp: str) -> str:
    """A name for one generation of the endpoint's model and config (<= 63 characters)."""
    return f"{name[:63 - len(stamp) - 1].rstrip('-')}-{stamp}"


def model_request(spec: Spec, model_name: str) -> dict:
    container: dict = {"Image": spec.image, "Environment": dict(spec.environment.values)}
    if spec.model_data:
        container["ModelDataSource"] = {"S3DataSource": {
            "S3Uri": spec.model_data, "S3DataType": "S3Prefix", "CompressionType": "None"}}
    return {"ModelName": model_name, "ExecutionRoleArn": spec.role, "PrimaryContainer": container}


def config_request(spec: Spec, config_name: str, model_name: str) -> dict:
    variant = {"VariantName": VARIANT, "ModelName": model_name, "InstanceType": spec.instance_type,
               "InitialInstanceCount": spec.instance_count,
               "ContainerStartupHealthCheckTimeoutInSeconds": spec.startup_timeout,
               "ModelDataDownloadTimeoutInSeconds": spec.download_timeout}
    if spec.volume_size is not None:
        variant["VolumeSizeInGB"] = spec.volume_size
    if spec.inference_ami:
        variant["InferenceAmiVersion"] = spec.inference_ami
    return {"EndpointConfigName": config_name, "ProductionVariants": [variant]}


def resource_id(name: str) -> str:
    return f"endpoint/{name}/variant/{VARIANT}"


def scaling_requests(spec: Spec) -> list[tuple[str, str, dict]]:
    target = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(spec.name),
              "ScalableDimension": SCALABLE_DIMENSION}
    return [
        ("application-autoscaling", "RegisterScalableTarget",
         {**target, "MinCapacity": spec.min_instances, "MaxCapacity": spec.max_instances}),
        ("application-autoscaling", "PutScalingPolicy",
         {**target, "PolicyName": f"{spec.name}-{spec.scale_metric}", "PolicyType": "TargetTrackingScaling",
          "TargetTrackingScalingPolicyConfiguration": {
              "TargetValue": spec.scale_target,
              "PredefinedMetricSpecification": {"PredefinedMetricType": SCALE_METRICS[spec.scale_metric]}}}),
    ]


# -- sending ----------------------------------------------------------------------------------------

def _snake(op: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


class Api:
    """Sends requests with boto3, or (dry run) prints them and sends nothing."""

    def __init__(self, dry_run: bool, session=None, out=sys.stdout, secret_env: set[str] = frozenset()):
        self.dry_run, self.out, self.secret_env = dry_run, out, set(secret_env)
        self._session, self._clients = session, {}

    def client(self, service: str):
        if service not in self._clients:
            import boto3
            session = self._session or boto3.Session()
            self._clients[service] = session.client(service)
        return self._clients[service]

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def shown(self, params: dict) -> dict:
        """params with the values of secret environment variables masked."""
        p = copy.deepcopy(params)
        env = p.get("PrimaryContainer", {}).get("Environment")
        if env:
            for k in env:
                if k in self.secret_env or looks_secret(k):
                    env[k] = MASK
        return p

    def print_request(self, service: str, op: str, params: dict) -> None:
        self.say(f"{service} {op}\n{json.dumps(self.shown(params), indent=2)}")

    def send(self, service: str, op: str, params: dict) -> dict:
        """A request that changes something: printed under --dry-run, else sent."""
        if self.dry_run:
            self.print_request(service, op, params)
            return {}
        self.say(f"{op} {_summary(params)}")
        return self.call(service, op, params)

    def call(self, service: str, op: str, params: dict) -> dict:
        """A request; an error is a DeployError naming the operation."""
        return self.read(service, op, params)  # with no `missing`, never None

    def read(self, service: str, op: str, params: dict, missing: str | None = None) -> dict | None:
        """A read; None when the error message contains `missing` (the resource does not exist)."""
        from botocore.exceptions import ClientError

        try:
            return getattr(self.client(service), _snake(op))(**params)
        except ClientError as e:
            err = e.response.get("Error", {})
            if missing and missing in str(err.get("Message", "")):
                return None
            raise DeployError(f"{op} failed: {err.get('Code')}: {err.get('Message')}") from None


def _summary(params: dict) -> str:
    for k in ("EndpointName", "EndpointConfigName", "ModelName", "PolicyName", "ResourceId"):
        if k in params:
            return f"{k}={params[k]}"
    return ""


NOT_FOUND = "Could not find endpoint"
NOT_FOUND_CONFIG = "Could not find endpoint configuration"
BUSY = ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting")


def describe(api: Api, name: str) -> dict | None:
    return api.read("sagemaker", "DescribeEndpoint", {"EndpointName": name}, missing=NOT_FOUND)


def wait(api: Api, name: str, timeout: float, poll: float, gone: bool = False) -> dict | None:
    """Poll DescribeEndpoint until it leaves the busy states (or, with gone, until it no longer exists).

    Prints each status change with the elapsed time, and the status every minute while nothing changes."""
    start = time.monotonic()
    last, last_print = None, -60.0
    while True:
        d = describe(api, name)
        elapsed = time.monotonic() - start
        status = d["EndpointStatus"] if d else "deleted"
        if status != last or elapsed - last_print >= 60:
            m, s = divmod(int(elapsed), 60)
            api.say(f"[{m:3d}:{s:02d}] {name}: {status}")
            last, last_print = status, elapsed
        if d is None or (not gone and status not in BUSY):
            return d
        if elapsed > timeout:
            raise DeployError(f"{name} still {status} after {int(timeout)} s (--wait-timeout); SageMaker goes on: "
                              f"watch it with `aws sagemaker describe-endpoint --endpoint-name {name}`")
        time.sleep(poll)


def failure(d: dict) -> str:
    reason = d.get("FailureReason") or "(SageMaker gave no FailureReason)"
    return (f"endpoint {d['EndpointName']} is {d['EndpointStatus']}: {reason}\n"
            f"The container's log: CloudWatch log group /aws/sagemaker/Endpoints/{d['EndpointName']}")


def scaling_target(api: Api, name: str) -> dict | None:
    r = api.read("application-autoscaling", "DescribeScalableTargets",
                 {"ServiceNamespace": "sagemaker", "ResourceIds": [resource_id(name)],
                  "ScalableDimension": SCALABLE_DIMENSION})
    targets = r.get("ScalableTargets", []) if r else []
    return targets[0] if targets else None


def remove_scaling(api: Api, name: str) -> None:
    """Delete the variant's scaling policies and deregister it (SageMaker refuses some updates otherwise)."""
    target = {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(name), "ScalableDimension": SCALABLE_DIMENSION}
    if api.dry_run:
        api.say("# if the variant is registered for autoscaling (DescribeScalableTargets), for each policy "
                "(DescribeScalingPolicies):")
        api.print_request("application-autoscaling", "DeleteScalingPolicy", {**target, "PolicyName": "<policy>"})
        api.print_request("application-autoscaling", "DeregisterScalableTarget", target)
        return
    if scaling_target(api, name) is None:
        return
    pols = api.read("application-autoscaling", "DescribeScalingPolicies",
                    {"ServiceNamespace": "sagemaker", "ResourceId": resource_id(name),
                     "ScalableDimension": SCALABLE_DIMENSION})
    for p in pols.get("ScalingPolicies", []):
        api.send("application-autoscaling", "DeleteScalingPolicy", {**target, "PolicyName": p["PolicyName"]})
    api.send("application-autoscaling", "DeregisterScalableTarget", target)


def add_scaling(api: Api, spec: Spec) -> None:
    for service, op, params in scaling_requests(spec):
        api.send(service, op, params)
    if not api.dry_run:
        api.say(f"autoscaling: {spec.min_instances}-{spec.max_instances} instances, target "
                f"{spec.scale_target:g} {SCALE_METRICS[spec.scale_metric]}")


# -- the commands ------------------------------------------------------------------------------

def create_generation(api: Api, spec: Spec, model: str, config: str, op: str, params: dict) -> None:
    """CreateModel, CreateEndpointConfig, then op (CreateEndpoint or UpdateEndpoint). If a request is
    refused, what this call made is deleted again, so a failed attempt leaves nothing behind."""
    made: list[tuple[str, dict]] = []
    try:
        api.send("sagemaker", "CreateModel", model_request(spec, model))
        made.append(("DeleteModel", {"ModelName": model}))
        api.send("sagemaker", "CreateEndpointConfig", config_request(spec, config, model))
        made.append(("DeleteEndpointConfig", {"EndpointConfigName": config}))
        api.send("sagemaker", op, params)
    except DeployError:
        for undo, undo_params in reversed(made):
            try:
                api.send("sagemaker", undo, undo_params)
            except DeployError as e:
                api.say(f"could not clean up: {e}")
        raise


def create(api: Api, spec: Spec, stamp: str, wait_for: bool, timeout: float, poll: float) -> int:
    model, config = stamped(spec.name, stamp), stamped(spec.name, stamp)
    if api.dry_run:
        api.say(f"# DescribeEndpoint {spec.name}: create goes on only if it does not exist")
    elif describe(api, spec.name) is not None:
        raise DeployError(f"endpoint {spec.name} exists; use `update` to deploy a new model or config to it, or "
                          "`delete` first")
    create_generation(api, spec, model, config, "CreateEndpoint",
                      {"EndpointName": spec.name, "EndpointConfigName": config})
    if api.dry_run:
        api.say(f"# then DescribeEndpoint {spec.name} every {poll:g} s until InService"
                + (", then:" if spec.autoscaling else ""))
        if spec.autoscaling:
            add_scaling(api, spec)
        return 0
    if not wait_for:
        api.say(f"not waiting (--no-wait): {spec.name} is Creating")
        return 0
    d = wait(api, spec.name, timeout, poll)
    if d["EndpointStatus"] != "InService":
        raise DeployError(failure(d))
    if spec.autoscaling:
        add_scaling(api, spec)
    api.say(f"endpoint {spec.name} is InService ({spec.instance_count} x {spec.instance_type})")
    return 0


def update(api: Api, spec: Spec, stamp: str, timeout: float, poll: float) -> int:
    model, config = stamped(spec.name, stamp), stamped(spec.name, stamp)
    if api.dry_run:
        old_config, old_models = "<the endpoint's EndpointConfigName (DescribeEndpoint)>", ["<its models>"]
        api.say(f"# DescribeEndpoint {spec.name}: update goes on only if it is InService or Failed")
    else:
        d = describe(api, spec.name)
        if d is None:
            raise DeployError(f"endpoint {spec.name} does not exist; use `create`")
        if d["EndpointStatus"] in BUSY:
            raise DeployError(f"endpoint {spec.name} is {d['EndpointStatus']}; wait until it is InService")
        old_config = d["EndpointConfigName"]
        c = api.read("sagemaker", "DescribeEndpointConfig", {"EndpointConfigName": old_config},
                     missing=NOT_FOUND_CONFIG)
        old_models = [v["ModelName"] for v in c["ProductionVariants"]] if c else []
        old_types = {v.get("InstanceType") for v in c["ProductionVariants"]} if c else set()
        if (not spec.autoscaling and old_types != {spec.instance_type}
                and scaling_target(api, spec.name) is not None):
            raise DeployError(f"endpoint {spec.name} has autoscaling and the instance type changes: SageMaker "
                              "refuses that update; pass --min-instances/--max-instances/--scale-target to attach "
                              "the policy again after it")
    # SageMaker refuses an update that changes the instance type of a registered variant:
    # the policy comes off first and goes back on once the endpoint runs the new config.
    if spec.autoscaling:
        remove_scaling(api, spec.name)
    create_generation(api, spec, model, config, "UpdateEndpoint",
                      {"EndpointName": spec.name, "EndpointConfigName": config})
    if api.dry_run:
        api.say(f"# then DescribeEndpoint {spec.name} every {poll:g} s until it is no longer Updating; once it "
                f"runs {config}:")
        if spec.autoscaling:
            add_scaling(api, spec)
        api.print_request("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": old_config})
        api.print_request("sagemaker", "DeleteModel", {"ModelName": old_models[0]})
        return 0
    d = wait(api, spec.name, timeout, poll)
    if d["EndpointStatus"] != "InService" or d["EndpointConfigName"] != config:
        # a failed update rolls back: the endpoint serves the old config again and says why
        reason = d.get("FailureReason") or "(SageMaker gave no FailureReason)"
        api.send("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": config})
        api.send("sagemaker", "DeleteModel", {"ModelName": model})
        raise DeployError(f"update of {spec.name} failed: {reason}\nThe endpoint is {d['EndpointStatus']} on "
                          f"{d['EndpointConfigName']}. The container's log: CloudWatch log group "
                          f"/aws/sagemaker/Endpoints/{spec.name}")
    if spec.autoscaling:
        add_scaling(api, spec)
    if old_config != config:
        api.send("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": old_config})
        for m in old_models:
            api.send("sagemaker", "DeleteModel", {"ModelName": m})
    api.say(f"endpoint {spec.name} is InService on {config}")
    return 0


def delete(api: Api, name: str, timeout: float, poll: float) -> int:
    if api.dry_run:
        config, models = "<the endpoint's EndpointConfigName (DescribeEndpoint)>", ["<its models>"]
        api.say(f"# DescribeEndpoint {name}, DescribeEndpointConfig: the config and models to delete")
    else:
        d = describe(api, name)
        if d is None:
            raise DeployError(f"endpoint {name} does not exist")
        config = d["EndpointConfigName"]
        c = api.read("sagemaker", "DescribeEndpointConfig", {"EndpointConfigName": config}, missing=NOT_FOUND_CONFIG)
        models = [v["ModelName"] for v in c["ProductionVariants"]] if c else []
    remove_scaling(api, name)
    api.send("sagemaker", "DeleteEndpoint", {"EndpointName": name})
    if api.dry_run:
        api.say(f"# then DescribeEndpoint {name} every {poll:g} s until it is gone, then:")
    else:
        wait(api, name, timeout, poll, gone=True)
    api.send("sagemaker", "DeleteEndpointConfig", {"EndpointConfigName": config})
    for m in models:
        api.send("sagemaker", "DeleteModel", {"ModelName": m})
    if not api.dry_run:
        api.say(f"deleted endpoint {name}, its config {config} and model(s) {', '.join(models) or '(none)'}")
    return 0


# -- command line -------------------------------------------------------------------------------

def _in_range(lo: int, hi: int, what: str):
    def parse(raw: str) -> int:
        try:
            n = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer ({what}: {lo}-{hi})") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is out of range ({what}: {lo}-{hi})")
        return n
    return parse


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m endpoint.deploy",
                                 description="Create, update or delete a SageMaker endpoint serving this image. "
                                 "AWS credentials and region come from boto3's usual sources.")
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("name", help="endpoint name; the model and endpoint config get NAME-<UTC time>")
    common.add_argument("--dry-run", action="store_true", help="print the exact API requests and send none "
                        "(secrets masked; no credentials needed)")
    common.add_argument("--wait-timeout", type=float, default=None,
                        help="seconds to wait (default: both container timeouts plus 30 minutes to provision)")
    common.add_argument("--poll-seconds", type=float, default=15.0, help="DescribeEndpoint interval (default 15)")

    def deploy_flags(p):
        p.add_argument("--image", required=True, help="the image URI in ECR")
        p.add_argument("--role", required=True, help="execution role ARN (reads the model data and the image)")
        p.add_argument("--model-data", help="s3://bucket/prefix/ holding the uncompressed model (config.json, "
                       "weights); SageMaker copies it to /opt/ml/model. Omit when option.model_id names the model")
        p.add_argument("--properties", help="a serving.properties file: its option.<key> lines become the "
                       "container's environment")
        p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a setting, as option.<KEY> of serving.properties (repeatable; wins over --properties)")
        p.add_argument("--secret-env", action="append", default=[], metavar="NAME",
                       help="copy a secret setting from this shell's environment, e.g. HF_TOKEN (never printed)")
        p.add_argument("--instance-type", default="ml.p5en.48xlarge", help="default ml.p5en.48xlarge (8 x H200)")
        p.add_argument("--instance-count", type=_in_range(1, 1000, "instances"), default=1)
        p.add_argument("--startup-timeout", type=_in_range(*TIMEOUT_RANGE, "seconds"), default=DEFAULT_STARTUP_TIMEOUT,
                       help="ContainerStartupHealthCheckTimeoutInSeconds: load, compile and warm-up until /ping "
                       f"answers 200 (default {DEFAULT_STARTUP_TIMEOUT}, SageMaker's maximum)")
        p.add_argument("--download-timeout", type=_in_range(*TIMEOUT_RANGE, "seconds"),
                       default=DEFAULT_DOWNLOAD_TIMEOUT, help="ModelDataDownloadTimeoutInSeconds "
                       f"(default {DEFAULT_DOWNLOAD_TIMEOUT}, SageMaker's maximum)")
        p.add_argument("--volume-size", type=_in_range(1, 512, "GB"), help="VolumeSizeInGB of the EBS volume; only "
                       "for instance types without local NVMe storage (ml.p4d, ml.p5, ml.p5en and ml.g5 use theirs)")
        p.add_argument("--inference-ami-version", default=DEFAULT_AMI, help="InferenceAmiVersion: the host's NVIDIA "
                       f"driver (default {DEFAULT_AMI}: driver 580, CUDA 13.0); 'none': SageMaker picks")
        p.add_argument("--min-instances", type=_in_range(1, 1000, "instances"),
                       help="with --max-instances: attach a target-tracking autoscaling policy")
        p.add_argument("--max-instances", type=_in_range(1, 1000, "instances"))
        p.add_argument("--scale-metric", choices=sorted(SCALE_METRICS), default="concurrency",
                       help="concurrency: requests in flight per instance (high resolution, 10 s); "
                       "invocations: requests per instance per minute (default concurrency)")
        p.add_argument("--scale-target", type=float, help="the metric's target value per instance")

    c = sub.add_parser("create", parents=[common], help="create the model, endpoint config and endpoint")
    deploy_flags(c)
    c.add_argument("--no-wait", action="store_true", help="return once CreateEndpoint is accepted")
    u = sub.add_parser("update", parents=[common], help="deploy a new model and config to an existing endpoint")
    deploy_flags(u)
    sub.add_parser("delete", parents=[common], help="delete the endpoint, its config and model(s)")
    return ap


def spec_from_args(args) -> Spec:
    env = build_environment(args.properties, args.option, args.secret_env)
    model_data = check_model_data(args.model_data) if args.model_data else None
    if model_data and "OPTION_MODEL_ID" in env.values:
        raise DeployError("both --model-data and model_id are set: the container would serve model_id and ignore "
                          "/opt/ml/model; keep one")
    if not model_data and "OPTION_MODEL_ID" not in env.values:
        raise DeployError("no model: pass --model-data s3://bucket/prefix/ or -o model_id=<hub id or s3:// prefix>")
    if (args.min_instances is None) != (args.max_instances is None):
        raise DeployError("autoscaling needs both --min-instances and --max-instances")
    if args.max_instances is not None:
        if not args.min_instances <= args.instance_count <= args.max_instances:
            raise DeployError(f"--instance-count {args.instance_count} must lie within --min-instances "
                              f"{args.min_instances} and --max-instances {args.max_instances}")
        if args.scale_target is None or args.scale_target <= 0:
            raise DeployError("autoscaling needs --scale-target, a positive value of the metric per instance "
                              f"({args.scale_metric})")
    if getattr(args, "no_wait", False) and args.max_instances is not None:
        raise DeployError("--no-wait with autoscaling: the policy can be attached only once the endpoint is InService")
    ami = None if args.inference_ami_version.lower() == "none" else args.inference_ami_version
    return Spec(check_name(args.name), args.image, args.role, env, model_data, args.instance_type,
                args.instance_count, args.startup_timeout, args.download_timeout, args.volume_size, ami,
                args.min_instances, args.max_instances, args.scale_metric, args.scale_target)


def main(argv: list[str] | None = None, session=None, out=None) -> int:
    """session: a boto3.Session (default: boto3's usual credentials, region and AWS_ENDPOINT_URL)."""
    out = out or sys.stdout
    args = parser().parse_args(argv)
    stamp = stamp_now()
    try:
        if args.command == "delete":
            api = Api(args.dry_run, session, out)
            return delete(api, check_name(args.name), args.wait_timeout or 3600, args.poll_seconds)
        spec = spec_from_args(args)
        timeout = args.wait_timeout or spec.download_timeout + spec.startup_timeout + 1800
        api = Api(args.dry_run, session, out, spec.environment.secret)
        for name in sorted(spec.environment.values):
            api.say(f"env {name}={spec.environment.masked()[name]}  [{spec.environment.sources[name]}]")
        for note in spec.environment.check_passthrough():
            api.say(f"note: {note}")
        if args.command == "create":
            return create(api, spec, stamp, not args.no_wait, timeout, args.poll_seconds)
        return update(api, spec, stamp, timeout, args.poll_seconds)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return 2
    except DeployError as e:
        print(f"deploy error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
