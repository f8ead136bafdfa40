"""``pax launch --k8s``: one command as the pods of a JobSet (jobset.x-k8s.io) on a Kubernetes
cluster, on GKE's TPU or GPU node pools or on CPU nodes, created, followed and waited for
through ``kubectl``.

A JobSet in every case: it names each pod in DNS (``NAME-JOB-I-J.NAME``, so process 0's address
is known before any pod starts), runs one Job per TPU slice, and fails as a whole when one pod
fails, as a run of collectives must. It never restarts (``maxRestarts`` and ``backoffLimit`` 0):
a restart would resume from the last checkpoint, which the same command does when submitted
again, so a failure is reported rather than hidden.

On TPUs, JAX joins the processes by itself from what GKE gives the pods of an indexed Job
(``TPU_WORKER_HOSTNAMES``, ``TPU_WORKER_ID``), and across slices from ``MEGASCALE_*`` (GKE's
multislice recipe). GPU and CPU pods get ``PAX_COORDINATOR_ADDRESS``, ``PAX_NUM_PROCESSES`` and
``PAX_PROCESS_ID``, the last from the pod's completion index through the downward API, so the
command runs as given, with no shell around it.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading

import yaml

from pax_core.errors import UsageError
from pax_core.parallel.processes import COORDINATOR_PORT

API_VERSION = "jobset.x-k8s.io/v1alpha2"
POLL_S = 5.0  # between two looks at the JobSet's state
GRACE_S = 10.0  # for the first pod's last log lines once the JobSet has ended
# GKE's TPU accelerator labels: (topology dimensions, most chips a single-host slice has). Every
# multi-host slice has 4 chips per host (GKE's ct4p/ct5p/tpu7x -4t and ct5lp/ct6e -4t machines);
# v5e and v6e also have an 8-chip host (-8t), which a 2x4 topology is taken to be.
TPU_TYPES = {"tpu-v4-podslice": (3, 4), "tpu-v5p-slice": (3, 4), "tpu7x": (3, 4),
             "tpu-v5-lite-podslice": (2, 8), "tpu-v6e-slice": (2, 8)}
MULTI_HOST_CHIPS = 4
DEFAULT_GPUS = 8  # GKE's A100, H100, H200 and B200 machines have 8 GPUs
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_JOB_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
_COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# The True conditions of a JobSet, one "TYPE<tab>REASON: MESSAGE" line each.
_CONDITIONS = ('jsonpath={range .status.conditions[?(@.status=="True")]}'
               '{.type}{"\\t"}{.reason}: {.message}{"\\n"}{end}')


@dataclasses.dataclass(frozen=True)
class KubernetesOptions:
    """Where and on what the pods run; see ``docker/README.md`` for the images."""

    image: str | None
    accelerator: str | None = None  # GKE's label value: tpu-v5p-slice, nvidia-h100-80gb, ...
    topology: str | None = None  # TPU: the slice's chips, as its node pool names them (4x4x4)
    slices: int = 1  # TPU: one Job per slice
    nodes: int = 1  # GPU and CPU: pods, one per node
    gpus_per_node: int | None = None  # GPU: nvidia.com/gpu per pod (DEFAULT_GPUS)
    namespace: str = "default"
    name: str = "pax"


def manifests(command: list[str], options: KubernetesOptions) -> list[dict]:
    """The objects to create for ``command``: one JobSet; a ``UsageError`` for a bad option."""
    _check(command, options)
    name, tpu = options.name, options.accelerator in TPU_TYPES
    env: list[dict] = []
    pod: dict = {"restartPolicy": "Never"}
    limits: dict[str, str] = {}
    if tpu:
        job, replicas = "slice", options.slices
        pods, chips = _tpu_hosts(options.accelerator, options.topology)
        pod["nodeSelector"] = {"cloud.google.com/gke-tpu-accelerator": options.accelerator,
                               "cloud.google.com/gke-tpu-topology": options.topology}
        limits["google.com/tpu"] = str(chips)
        if replicas > 1:  # traffic between slices goes over the hosts' own network (DCN)
            pod |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
            env += [_field("JOBSET_NAME", "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"),
                    _field("REPLICATED_JOB_NAME",
                           "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"),
                    {"name": "MEGASCALE_COORDINATOR_ADDRESS",
                     "value": "$(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-0-0.$(JOBSET_NAME)"},
                    {"name": "MEGASCALE_NUM_SLICES", "value": str(replicas)},
                    _field("MEGASCALE_SLICE_ID", _JOB_INDEX)]
    else:
        job, replicas, pods = "worker", 1, options.nodes
        if options.accelerator is not None:
            pod["nodeSelector"] = {"cloud.google.com/gke-accelerator": options.accelerator}
            limits["nvidia.com/gpu"] = str(options.gpus_per_node or DEFAULT_GPUS)
        # Pods of one run never share a node: --nodes counts machines.
        pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": name}},
             "topologyKey": "kubernetes.io/hostname"}]}}
        env += [{"name": "PAX_COORDINATOR_ADDRESS",
                 "value": f"{name}-{job}-0-0.{name}:{COORDINATOR_PORT}"},
                {"name": "PAX_NUM_PROCESSES", "value": str(pods)},
                _field("PAX_PROCESS_ID", _COMPLETION_INDEX)]
    _check_host_names(name, job, replicas, pods)
    container: dict = {"name": "pax", "image": options.image, "command": list(command)}
    if env:
        container["env"] = env
    if limits:
        container["resources"] = {"limits": limits}
    pod["containers"] = [container]
    metadata: dict = {"name": name, "namespace": options.namespace}
    if tpu:  # each slice's Job on a node pool of its own, as GKE's TPU examples place them
        metadata["annotations"] = {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
    template = {"spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed",
                         "backoffLimit": 0, "template": {"spec": pod}}}
    return [{"apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata, "spec": {
        "failurePolicy": {"maxRestarts": 0},
        "network": {"enableDNSHostnames": True},
        "replicatedJobs": [{"name": job, "replicas": replicas, "template": template}]}}]


def launch(command: list[str], options: KubernetesOptions, dry_run: bool = False) -> int:
    """Create the JobSet, print its first pod's output, and wait for it to end; returns the
    launcher's exit code (0 completed, 1 failed, 128 + N after signal N, which deletes it).
    ``dry_run`` prints the manifests as YAML instead, and needs no ``kubectl``."""
    documents = manifests(command, options)
    if dry_run:
        print(yaml.safe_dump_all(documents, sort_keys=False), end="")
        return 0
    if shutil.which("kubectl") is None:
        raise UsageError("pax launch --k8s needs kubectl on PATH "
                         "(https://kubernetes.io/docs/tasks/tools/, or gcloud components "
                         "install kubectl)")
    # The launcher's signals arrive as events, so the loop below waits on them and the poll.
    events: queue.SimpleQueue[int] = queue.SimpleQueue()
    previous = {s: signal.signal(s, lambda signum, _: events.put(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    logs = _FirstPodLogs(options)
    try:
        _create(documents, options)
        print(f"pax launch: created JobSet {options.name} in namespace {options.namespace}",
              file=sys.stderr, flush=True)
        logs.start()
        while True:
            ended = _ended(options)
            if ended is not None:
                logs.finish(POLL_S + GRACE_S)
                return ended
            try:
                signum = events.get(timeout=POLL_S)
            except queue.Empty:
                continue
            logs.finish(0)
            return _delete(options, signum)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _check(command: list[str], options: KubernetesOptions) -> None:
    if not command:
        raise UsageError("pax launch --k8s needs the command to run after --, such as: "
                         "pax launch --k8s --image IMAGE -- pax train --exp ... --job-dir gs://...")
    if not options.image:
        raise UsageError("--k8s needs --image IMAGE (docker/README.md builds one)")
    if len(options.name) > 63 or not _DNS_1035.fullmatch(options.name):
        raise UsageError(f"--name '{options.name}': a JobSet's name is a DNS-1035 label: "
                         f"lowercase letters, digits and '-', starting with a letter, not "
                         f"ending with '-', at most 63 characters (such as pax-lm-1b)")
    if len(options.namespace) > 63 or not _DNS_1123.fullmatch(options.namespace):
        raise UsageError(f"--namespace '{options.namespace}': not a Kubernetes namespace name "
                         f"(lowercase letters, digits and '-'); see kubectl get namespaces")
    for option, value in (("--slices", options.slices), ("--nodes", options.nodes),
                          ("--gpus-per-node", options.gpus_per_node)):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be an integer >= 1, got {value}")
    accelerator = options.accelerator
    if accelerator in TPU_TYPES:
        if options.topology is None:
            raise UsageError(f"--accelerator {accelerator} needs --topology, the slice's chips "
                             f"as its node pool has them (such as "
                             f"{'2x2x2' if TPU_TYPES[accelerator][0] == 3 else '4x4'})")
        _tpu_hosts(accelerator, options.topology)
        given = ("--nodes", options.nodes) if options.nodes != 1 else (
            "--gpus-per-node", options.gpus_per_node)
        if given[1] is not None:
            raise UsageError(f"{' '.join(map(str, given))} is for GPU or CPU pods; a TPU "
                             f"slice's hosts and chips follow from --topology {options.topology}")
        return
    if accelerator is not None and not accelerator.startswith("nvidia-"):
        raise UsageError(f"--accelerator '{accelerator}': not a GKE accelerator label Pax "
                         f"knows; give a TPU's ({', '.join(TPU_TYPES)}) or a GPU's "
                         f"(nvidia-h100-80gb, nvidia-a100-80gb, ...), or none for CPU pods")
    what = f"--accelerator {accelerator}" if accelerator else "CPU pods (no --accelerator)"
    if options.topology is not None:
        raise UsageError(f"--topology {options.topology} is for TPU accelerators, not {what}")
    if options.slices > 1:
        raise UsageError(f"--slices {options.slices} is for TPU accelerators, not {what}; "
                         f"give --nodes N for N pods")
    if accelerator is None and options.gpus_per_node is not None:
        raise UsageError(f"--gpus-per-node {options.gpus_per_node} needs a GPU --accelerator "
                         f"(such as nvidia-h100-80gb)")


def _tpu_hosts(accelerator: str, topology: str) -> tuple[int, int]:
    """``(hosts, chips per host)`` of one slice, by GKE's TPU node pools: a slice that fits one
    host is one pod with all its chips; a larger one has 4 chips per host."""
    dimensions, single_host = TPU_TYPES[accelerator]
    shape = "x".join(["N", "M", "K"][:dimensions])
    if not re.fullmatch(r"[1-9]\d*" + r"x[1-9]\d*" * (dimensions - 1), topology):
        raise UsageError(f"--topology '{topology}': {accelerator} slices are {shape} (such as "
                         f"{'2x2x2' if dimensions == 3 else '4x4'})")
    chips = math.prod(int(d) for d in topology.split("x"))
    if chips <= single_host:
        return 1, chips
    if chips % MULTI_HOST_CHIPS:
        raise UsageError(f"--topology {topology}: {chips} chips do not fill hosts of "
                         f"{MULTI_HOST_CHIPS}; give a topology of a {accelerator} node pool")
    return chips // MULTI_HOST_CHIPS, MULTI_HOST_CHIPS


def _check_host_names(name: str, job: str, replicas: int, pods: int) -> None:
    """The last pod's host name, ``NAME-JOB-I-J``, must be a DNS label (63 characters)."""
    longest = f"{name}-{job}-{replicas - 1}-{pods - 1}"
    if len(longest) > 63:
        raise UsageError(f"--name {name}: too long for its pods' host names ({longest} is over "
                         f"63 characters); give at most {63 - len(longest) + len(name)} "
                         f"characters")


def _field(variable: str, path: str) -> dict:
    return {"name": variable, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


def _create(documents: list[dict], options: KubernetesOptions) -> None:
    """``kubectl create``, not ``apply``: a JobSet of the same name left by an earlier run must be
    an error, not an "unchanged" object whose old result would be reported as this one's."""
    result = _kubectl("create", "-n", options.namespace, "-f", "-",
                      stdin=yaml.safe_dump_all(documents, sort_keys=False))
    if result.returncode == 0:
        return
    error = result.stderr.strip()
    name, namespace = options.name, options.namespace
    if "AlreadyExists" in error or "already exists" in error:
        raise UsageError(f"a JobSet named {name} already exists in namespace {namespace}: "
                         f"delete it (kubectl delete jobset {name} -n {namespace}) or give "
                         f"another --name")
    if "no matches for kind" in error:
        raise UsageError(f"the cluster has no JobSet API ({API_VERSION}): install JobSet "
                         f"(https://jobset.sigs.k8s.io/docs/installation/)")
    first = error.splitlines()[0] if error else f"exit status {result.returncode}"
    raise UsageError(f"kubectl create failed: {first}; check kubectl's cluster and "
                     f"credentials (kubectl config current-context)")


def _ended(options: KubernetesOptions) -> int | None:
    """The exit code once the JobSet has completed (0) or failed (1, saying why), else None."""
    name, namespace = options.name, options.namespace
    result = _kubectl("get", "jobset", name, "-n", namespace, "-o", _CONDITIONS)
    if result.returncode:
        if "NotFound" in result.stderr:
            print(f"pax launch: JobSet {name} was deleted before it ended", file=sys.stderr)
            return 1
        print(f"pax launch: kubectl get jobset {name}: {result.stderr.strip()}; trying again",
              file=sys.stderr)  # the cluster may be out of reach for a while
        return None
    conditions = dict(line.split("\t", 1) for line in result.stdout.splitlines() if "\t" in line)
    if "Completed" in conditions:
        print(f"pax launch: JobSet {name} completed", file=sys.stderr)
        return 0
    if "Failed" not in conditions:
        return None
    pods = _kubectl("get", "pods", "-n", namespace, "-l", f"jobset.sigs.k8s.io/jobset-name={name}",
                    "--field-selector=status.phase=Failed", "-o",
                    "jsonpath={range .items[*]}{.metadata.name} (exit "
                    "{.status.containerStatuses[0].state.terminated.exitCode}), {end}")
    which = pods.stdout.strip().rstrip(",") if pods.returncode == 0 else ""
    print(f"pax launch: JobSet {name} failed ({conditions['Failed']})"
          f"{'; failed pods: ' + which if which else ''}; see kubectl describe jobset {name} "
          f"-n {namespace}", file=sys.stderr)
    return 1


def _delete(options: KubernetesOptions, signum: int) -> int:
    """Delete the JobSet after the launcher's signal: its pods get SIGTERM, on which Pax saves a
    checkpoint, so the same command resumes once submitted again."""
    name, namespace = options.name, options.namespace
    result = _kubectl("delete", "jobset", name, "-n", namespace, "--wait=false")
    if result.returncode:
        print(f"pax launch: could not delete JobSet {name} ({result.stderr.strip()}); delete it "
              f"with: kubectl delete jobset {name} -n {namespace}", file=sys.stderr)
    else:
        print(f"pax launch: stopped: deleted JobSet {name} in namespace {namespace}",
              file=sys.stderr)
    return 128 + signum


class _FirstPodLogs(threading.Thread):
    """Prints the output of the run's first pod (job 0, completion index 0), prefixed with
    ``[k8s]``, once it runs: ``kubectl logs`` refuses a pod that is still pending."""

    def __init__(self, options: KubernetesOptions):
        super().__init__(daemon=True)
        self.options = options
        self.ended = threading.Event()  # the JobSet ended: look once more, then give up
        self.lock = threading.Lock()  # no `kubectl logs` starts once finish() has stopped
        self.stopped = False
        self.process: subprocess.Popen[str] | None = None

    def run(self) -> None:
        selector = (f"jobset.sigs.k8s.io/jobset-name={self.options.name},"
                    f"jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0")
        while True:
            found = _kubectl("get", "pods", "-n", self.options.namespace, "-l", selector, "-o",
                             'jsonpath={range .items[*]}{.metadata.name} {.status.phase}'
                             '{"\\n"}{end}')
            pod = next((line.split()[0] for line in found.stdout.splitlines()
                        if line.split()[1:] in (["Running"], ["Succeeded"], ["Failed"])), None)
            if pod is not None or self.ended.is_set():
                break
            self.ended.wait(POLL_S)
        with self.lock:
            if pod is None or self.stopped:  # it never ran, or the launcher is done
                return
            self.process = subprocess.Popen(
                ["kubectl", "logs", "-f", "-n", self.options.namespace, pod],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
        for line in self.process.stdout:
            print(f"[k8s] {line.rstrip()}", flush=True)

    def finish(self, timeout: float) -> None:
        """Give the output ``timeout`` seconds to end, then stop following it."""
        self.ended.set()
        self.join(timeout)
        with self.lock:
            self.stopped = True
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
        self.join(GRACE_S)
