"""``pax launch --k8s``: the JobSets it writes, checked against the JobSet and Kubernetes
schemas and read the way the cluster and JAX read them; its refusals; its run through
``kubectl``; and the Docker images it runs."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes.client import ApiClient

from pax_core.errors import UsageError
from pax_core.launchers import kubernetes
from pax_core.launchers.kubernetes import KubernetesOptions, launch, manifests
from pax_core.parallel.processes import DistributedOptions

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["pax", "train", "--exp", "lm.Tiny", "--job-dir", "gs://bucket/run 1"]
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
DNS_LABEL = {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}


def _closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


# JobSet's own fields (jobset.x-k8s.io/v1alpha2, its API types): a misspelled or misplaced field
# fails here instead of being dropped by the API server. The Job templates inside are checked
# against Kubernetes' batch/v1 model by _check_job_template.
JOBSET_SCHEMA = _closed({
    "apiVersion": {"const": "jobset.x-k8s.io/v1alpha2"},
    "kind": {"const": "JobSet"},
    "metadata": _closed({"name": DNS_LABEL, "namespace": DNS_LABEL, "labels": STRINGS,
                         "annotations": STRINGS}, ("name",)),
    "spec": _closed({
        "replicatedJobs": {"type": "array", "minItems": 1, "items": _closed({
            "name": DNS_LABEL, "groupName": {"type": "string"},
            "replicas": {"type": "integer", "minimum": 1}, "template": {"type": "object"},
            "dependsOn": {"type": "array"}}, ("name", "template"))},
        "network": _closed({"enableDNSHostnames": {"type": "boolean"},
                            "subdomain": {"type": "string"},
                            "publishNotReadyAddresses": {"type": "boolean"}}),
        "failurePolicy": _closed({
            "maxRestarts": {"type": "integer", "minimum": 0},
            "restartStrategy": {"enum": ["Recreate", "BlockingRecreate", "InPlaceRestart"]},
            "rules": {"type": "array"}}),
        "successPolicy": _closed({"operator": {"enum": ["All", "Any"]},
                                  "targetReplicatedJobs": {"type": "array"}}, ("operator",)),
        "startupPolicy": {"type": "object"}, "suspend": {"type": "boolean"},
        "coordinator": {"type": "object"}, "managedBy": {"type": "string"},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "volumeClaimPolicies": {"type": "array"}}, ("replicatedJobs",)),
}, ("apiVersion", "kind", "metadata", "spec"))


def _check_job_template(template: dict) -> None:
    """A JobSet's Job template is a batch/v1 JobTemplateSpec: read through the Kubernetes
    client's models (which refuse a missing required field) it must come back unchanged, so
    no field is unknown, misplaced or of the wrong type (a number where a string belongs)."""
    client = ApiClient()
    back = client.sanitize_for_serialization(
        client._ApiClient__deserialize(template, "V1JobTemplateSpec"))
    assert not _differences(template, back), _differences(template, back)


def _differences(given: object, back: object, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(back, dict):
        return [d for key in given.keys() | back.keys()
                for d in _differences(given.get(key), back.get(key), f"{path}.{key}")]
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        return [d for i, (a, b) in enumerate(zip(given, back, strict=True))
                for d in _differences(a, b, f"{path}[{i}]")]
    return [] if given == back else [f"{path}: {given!r} became {back!r}"]


def _valid(documents: list[dict]) -> dict:
    assert len(documents) == 1
    jobset = documents[0]
    jsonschema.validate(jobset, JOBSET_SCHEMA)
    for job in jobset["spec"]["replicatedJobs"]:
        _check_job_template(job["template"])
    return jobset


def _pods(jobset: dict) -> list[tuple[int, int]]:
    """(job index, completion index) of every pod the JobSet runs."""
    job = jobset["spec"]["replicatedJobs"][0]
    return [(j, i) for j in range(job["replicas"])
            for i in range(job["template"]["spec"]["completions"])]


def _host(jobset: dict, job_index: int, completion_index: int) -> str:
    """A pod's DNS name, as JobSet's headless service gives it (enableDNSHostnames)."""
    name, job = jobset["metadata"]["name"], jobset["spec"]["replicatedJobs"][0]["name"]
    return f"{name}-{job}-{job_index}-{completion_index}.{name}"


def _container(jobset: dict) -> dict:
    job = jobset["spec"]["replicatedJobs"][0]
    return job["template"]["spec"]["template"]["spec"]["containers"][0]


def _environment(jobset: dict, job_index: int, completion_index: int) -> dict[str, str]:
    """What a pod's variables become on the cluster: the downward API reads the annotations that
    JobSet and the Job controller put on the pod, and $(NAME) expands an earlier variable."""
    annotations = {
        "jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"],
        "jobset.sigs.k8s.io/replicatedjob-name": jobset["spec"]["replicatedJobs"][0]["name"],
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "batch.kubernetes.io/job-completion-index": str(completion_index)}
    env: dict[str, str] = {}
    for variable in _container(jobset).get("env", []):
        if "valueFrom" in variable:
            path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            env[variable["name"]] = annotations[re.fullmatch(
                r"metadata\.annotations\['(.+)'\]", path)[1]]
        else:
            env[variable["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]),
                                           variable["value"])
    return env


def _pod_spec(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _common(jobset: dict, hosts: int) -> None:
    """What every JobSet of Pax has: a failure ends it, pods reach each other by name."""
    spec = jobset["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 0}
    assert spec["network"] == {"enableDNSHostnames": True}
    job = spec["replicatedJobs"][0]["template"]["spec"]
    assert (job["parallelism"], job["completions"]) == (hosts, hosts)
    assert (job["completionMode"], job["backoffLimit"]) == ("Indexed", 0)
    assert _pod_spec(jobset)["restartPolicy"] == "Never"
    assert _container(jobset)["command"] == COMMAND
    assert _container(jobset)["image"] == "registry/pax:1"


def test_one_tpu_slice_is_its_hosts_with_their_chips():
    options = KubernetesOptions("registry/pax:1", "tpu-v5p-slice", "2x2x2", name="lm")
    jobset = _valid(manifests(COMMAND, options))
    _common(jobset, hosts=2)
    assert jobset["spec"]["replicatedJobs"][0]["replicas"] == 1
    pod = _pod_spec(jobset)
    assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                   "cloud.google.com/gke-tpu-topology": "2x2x2"}
    assert _container(jobset)["resources"] == {"limits": {"google.com/tpu": "4"}}
    assert "env" not in _container(jobset)  # JAX finds the slice's workers from GKE's variables
    assert jobset["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}


@pytest.mark.parametrize(("accelerator", "topology", "hosts", "chips"), [
    ("tpu-v5p-slice", "2x2x1", 1, 4), ("tpu-v4-podslice", "4x4x4", 16, 4),
    ("tpu-v5-lite-podslice", "2x2", 1, 4), ("tpu-v6e-slice", "2x4", 1, 8),
    ("tpu-v6e-slice", "1x1", 1, 1), ("tpu-v6e-slice", "16x16", 64, 4)])
def test_tpu_hosts_follow_gkes_node_pools(accelerator, topology, hosts, chips):
    jobset = _valid(manifests(COMMAND, KubernetesOptions("registry/pax:1", accelerator, topology)))
    _common(jobset, hosts)
    assert _container(jobset)["resources"]["limits"] == {"google.com/tpu": str(chips)}


def test_tpu_slices_join_through_megascale_as_jax_reads_it(monkeypatch):
    from jax._src.clusters.cloud_tpu_cluster import GkeTpuCluster

    options = KubernetesOptions("registry/pax:1", "tpu-v5p-slice", "2x2x2", slices=2)
    jobset = _valid(manifests(COMMAND, options))
    _common(jobset, hosts=2)
    assert jobset["spec"]["replicatedJobs"][0]["replicas"] == 2
    assert _pod_spec(jobset)["hostNetwork"] is True
    processes = set()
    for job_index, index in _pods(jobset):
        env = _environment(jobset, job_index, index)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == _host(jobset, 0, 0) == "pax-slice-0-0.pax"
        assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"]) == ("2", str(job_index))
        # What GKE adds to the pod of a TPU slice, then JAX's own reading of the whole.
        workers = ",".join(_host(jobset, job_index, i) for i in range(2))
        for key, value in {**env, "TPU_WORKER_HOSTNAMES": workers,
                           "TPU_WORKER_ID": str(index)}.items():
            monkeypatch.setenv(key, value)
        assert GkeTpuCluster.get_process_count() == 4
        processes.add(GkeTpuCluster.get_process_id())
    assert processes == {0, 1, 2, 3}


def test_gpu_nodes_join_through_pax_variables(monkeypatch):
    options = KubernetesOptions("registry/pax:1", "nvidia-h100-80gb", nodes=2, name="gpu-run")
    jobset = _valid(manifests(COMMAND, options))
    _common(jobset, hosts=2)
    pod = _pod_spec(jobset)
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert _container(jobset)["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["topologyKey"] == "kubernetes.io/hostname"
    for job_index, index in _pods(jobset):
        for key, value in _environment(jobset, job_index, index).items():
            monkeypatch.setenv(key, value)
        assert DistributedOptions.parse() == DistributedOptions(
            f"{_host(jobset, 0, 0)}:{kubernetes.COORDINATOR_PORT}", 2, index)
    assert _host(jobset, 0, 0) == "gpu-run-worker-0-0.gpu-run"
    fewer = KubernetesOptions("registry/pax:1", "nvidia-a100-80gb", gpus_per_node=4)
    assert _container(_valid(manifests(COMMAND, fewer)))["resources"]["limits"] == {
        "nvidia.com/gpu": "4"}


def test_cpu_pods_have_no_accelerator(monkeypatch):
    jobset = _valid(manifests(COMMAND, KubernetesOptions("registry/pax:1", nodes=2,
                                                         namespace="research")))
    _common(jobset, hosts=2)
    assert jobset["metadata"]["namespace"] == "research"
    assert "nodeSelector" not in _pod_spec(jobset)
    assert "resources" not in _container(jobset)
    for key, value in _environment(jobset, 0, 1).items():
        monkeypatch.setenv(key, value)
    assert DistributedOptions.parse() == DistributedOptions("pax-worker-0-0.pax:8476", 2, 1)


def test_dry_run_prints_the_manifests_as_yaml(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "")  # a dry run needs no kubectl
    options = KubernetesOptions("registry/pax:1", "tpu-v6e-slice", "4x4", slices=2)
    assert launch(COMMAND, options, dry_run=True) == 0
    printed = capsys.readouterr().out
    assert list(yaml.safe_load_all(printed)) == manifests(COMMAND, options)
    assert "gs://bucket/run 1" in printed


@pytest.mark.parametrize(("command", "options", "named"), [
    ([], {}, "after --"),
    (COMMAND, {"image": None}, "--image IMAGE"),
    (COMMAND, {"accelerator": "tpu-v5p-slice"}, "tpu-v5p-slice needs --topology"),
    (COMMAND, {"accelerator": "tpu-v5p-slice", "topology": "4x4"}, "'4x4'"),
    (COMMAND, {"accelerator": "tpu-v6e-slice", "topology": "2x2x2"}, "'2x2x2'"),
    (COMMAND, {"accelerator": "tpu-v6e-slice", "topology": "4by4"}, "'4by4'"),
    (COMMAND, {"accelerator": "tpu-v4-podslice", "topology": "0x2x2"}, "'0x2x2'"),
    (COMMAND, {"accelerator": "tpu-v6e-slice", "topology": "3x3"}, "--topology 3x3"),
    (COMMAND, {"accelerator": "tpu-v9-slice", "topology": "2x2"}, "'tpu-v9-slice'"),
    (COMMAND, {"accelerator": "amd-mi300x"}, "'amd-mi300x'"),
    (COMMAND, {"accelerator": "nvidia-h100-80gb", "slices": 2}, "--slices 2"),
    (COMMAND, {"slices": 3}, "--slices 3"),
    (COMMAND, {"accelerator": "nvidia-h100-80gb", "topology": "2x2"}, "--topology 2x2"),
    (COMMAND, {"accelerator": "tpu-v5p-slice", "topology": "2x2x2", "nodes": 2}, "--nodes 2"),
    (COMMAND, {"accelerator": "tpu-v5p-slice", "topology": "2x2x2", "gpus_per_node": 8},
     "--gpus-per-node 8"),
    (COMMAND, {"gpus_per_node": 4}, "--gpus-per-node 4"),
    (COMMAND, {"nodes": 0}, "--nodes must be an integer >= 1, got 0"),
    (COMMAND, {"accelerator": "tpu-v5p-slice", "topology": "2x2x2", "slices": 0},
     "--slices must be an integer >= 1, got 0"),
    (COMMAND, {"accelerator": "nvidia-h100-80gb", "gpus_per_node": 0}, "got 0"),
    (COMMAND, {"name": "Pax_1"}, "'Pax_1'"),
    (COMMAND, {"name": "1pax"}, "'1pax'"),
    (COMMAND, {"name": "p" * 60}, "p" * 60),
    (COMMAND, {"namespace": "my space"}, "'my space'"),
])
def test_refusals_name_the_bad_value(command, options, named):
    given = {"image": "registry/pax:1", **options}
    with pytest.raises(UsageError, match=re.escape(named)) as refused:
        launch(command, KubernetesOptions(**given), dry_run=True)
    assert "\n" not in str(refused.value)


def test_refuses_without_kubectl(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="needs kubectl on PATH"):
        launch(COMMAND, KubernetesOptions("registry/pax:1"))


# A stand-in for kubectl and a cluster that cannot run here: it records each call, takes the
# JobSet, shows the first pod running with two lines of output, and answers the JobSet's state
# from its third look on as $END says (or sends its caller SIGTERM when END=signal).
STAND_IN = """\
import json, os, pathlib, signal, sys
state = pathlib.Path(os.environ["STAND_IN_STATE"])
args = sys.argv[1:]
with open(state / "calls", "a") as calls:
    calls.write(json.dumps(args) + "\\n")
end = os.environ["END"]
if args[0] == "create":
    if end == "exists":
        sys.exit(print('Error from server (AlreadyExists): jobsets "pax" already exists',
                       file=sys.stderr) or 1)
    (state / "created.yaml").write_text(sys.stdin.read())
elif args[:2] == ["get", "pods"]:
    failed = "--field-selector=status.phase=Failed" in args
    print("pax-worker-0-1-b7x2q (exit 3), " if failed else "pax-worker-0-0-k4m2z Running")
elif args[0] == "logs":
    print("step 1 loss 2.5\\nstep 2 loss 2.1")
elif args[:2] == ["get", "jobset"]:
    looks = sum('"jobset"' in line for line in open(state / "calls"))
    if looks >= 3 and end == "signal":
        os.kill(os.getppid(), signal.SIGTERM)
    elif looks >= 3:
        why = {"Failed": "FailedJobs: jobset failed due to job failure",
               "Completed": "AllJobsCompleted: jobset completed successfully"}[end]
        print(f"{end}\\t{why}")
"""


@pytest.mark.parametrize(("end", "code", "said"), [
    ("Completed", 0, "JobSet pax completed"),
    ("Failed", 1, "JobSet pax failed (FailedJobs: jobset failed due to job failure); failed "
                  "pods: pax-worker-0-1-b7x2q (exit 3)"),
    ("signal", 143, "stopped: deleted JobSet pax in namespace default")])
def test_launch_creates_follows_and_waits(end, code, said, monkeypatch, tmp_path, capsys):
    calls = _stand_in(monkeypatch, tmp_path, end)
    options = KubernetesOptions("registry/pax:1", nodes=2)
    assert launch(COMMAND, options) == code
    out, err = capsys.readouterr()
    assert said in err
    assert "[k8s] step 1 loss 2.5\n[k8s] step 2 loss 2.1\n" in out
    assert list(yaml.safe_load_all((tmp_path / "created.yaml").read_text())) == manifests(
        COMMAND, options)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert made[0] == ["create", "-n", "default", "-f", "-"]
    assert ["logs", "-f", "-n", "default", "pax-worker-0-0-k4m2z"] in made
    deleted = ["delete", "jobset", "pax", "-n", "default", "--wait=false"]
    assert (deleted in made) == (end == "signal")


def test_launch_refuses_a_jobset_that_exists(monkeypatch, tmp_path):
    _stand_in(monkeypatch, tmp_path, "exists")
    with pytest.raises(UsageError, match="kubectl delete jobset pax -n default"):
        launch(COMMAND, KubernetesOptions("registry/pax:1"))


def _stand_in(monkeypatch, tmp_path: Path, end: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\n{STAND_IN}")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STAND_IN_STATE", str(tmp_path))
    monkeypatch.setenv("END", end)
    monkeypatch.setattr(kubernetes, "POLL_S", 0.05)
    return tmp_path / "calls"


def _installs(dockerfile: str) -> tuple[str, dict[str, set[str]]]:
    """A Dockerfile's base image and the packages of this repository its pip installs, with
    their extras."""
    text = (ROOT / "docker" / dockerfile).read_text().replace("\\\n", " ")
    base = re.search(r"^FROM (\S+)", text, re.M)[1]
    packages: dict[str, set[str]] = {}
    for line in re.findall(r"^RUN .*pip install (.*)$", text, re.M):
        for word in shlex.split(line):
            found = re.fullmatch(r"/src/?([^\[]*)(?:\[(.*)\])?", word)
            assert found, f"{dockerfile} installs {word}, not a package of this repository"
            packages[found[1] or "."] = set(filter(None, (found[2] or "").split(",")))
    return base, packages


def _requirements(packages: dict[str, set[str]]) -> list[str]:
    """The requirements the packages' chosen extras add."""
    added = []
    for where, extras in packages.items():
        optional = tomllib.loads((ROOT / where / "pyproject.toml").read_text())["project"].get(
            "optional-dependencies", {})
        assert extras <= optional.keys(), f"{where} has no extra {extras - optional.keys()}"
        added += [r for extra in extras for r in optional[extra]]
    return added


def test_images_install_the_same_pax_with_their_runtime():
    base, cpu = _installs("Dockerfile.cpu")
    listed = {str(Path(p["install"].partition("[")[0])) for p in tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["tool"]["pax"]["packages"]}
    assert cpu.keys() <= listed
    assert not any(r.startswith("jax[") for r in _requirements(cpu))
    for dockerfile, runtime, plugin in (("Dockerfile.tpu", "jax[tpu]", "plugins/pax_multislice"),
                                        ("Dockerfile.cuda", "jax[cuda12]", "plugins/pax_gpu")):
        image_base, packages = _installs(dockerfile)
        assert image_base == base
        assert packages.keys() == cpu.keys() | {plugin}, dockerfile
        assert all(cpu[p] <= packages[p] for p in cpu), dockerfile
        assert any(r.startswith(runtime) for r in _requirements(packages)), dockerfile
