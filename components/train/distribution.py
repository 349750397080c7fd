"""Which strategy to train with, from TF_CONFIG (or a TrainJob pod's identity), validated so that a cluster is
never silently a single worker.

- several workers (TF_CONFIG with more than one task): `MultiWorkerMirroredStrategy`, synchronous
  all-reduce (the TF2 form of `SyncReplicasOptimizer`);
- one worker with several GPUs: `MirroredStrategy`;
- otherwise the default strategy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from components.common import documents, filesystem

logger = logging.getLogger(__name__)

TF_CONFIG = "TF_CONFIG"
# A TrainJob's pods (launch_trainjob.py): the job's name and size come from the TrainJob's env, the index from
# Kubernetes (every pod of an Indexed Job has it), the host names from JobSet: `<job>-node-0-<i>.<job>`.
TRAINJOB_NAME = "TRAINJOB_NAME"
TRAINJOB_NUM_NODES = "TRAINJOB_NUM_NODES"
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
WORKER_PORT = 2222  # the port each worker serves on (the runtime's containerPort, manifests/admin/trainer/)
# Tests only: {"host:port": "127.0.0.1:port"}, so that worker processes on one machine stand in for a TrainJob's
# pods under the host names JobSet would give them.
ADDRESS_MAP = "CIFAR10_PIPELINE_TEST_ADDRESS_MAP"


class ClusterError(ValueError):
    """TF_CONFIG is malformed, or describes a cluster other than the one asked for."""


@dataclass(frozen=True)
class Cluster:
    tasks: dict[str, list[str]]  # task type -> addresses
    task_type: str
    task_index: int

    @property
    def size(self) -> int:
        return sum(len(addresses) for task_type, addresses in self.tasks.items() if task_type in ("chief", "worker"))

    @property
    def is_chief(self) -> bool:
        """The chief writes checkpoints and summaries: the `chief` task, or worker 0 when there is none."""
        if "chief" in self.tasks:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def name(self) -> str:
        return f"{self.task_type}-{self.task_index}"

    @property
    def address(self) -> str:
        return self.tasks[self.task_type][self.task_index]

    def peers(self) -> dict[str, str]:
        """The other training tasks: name -> host:port."""
        return {
            f"{task_type}-{index}": address
            for task_type in ("chief", "worker")
            for index, address in enumerate(self.tasks.get(task_type, []))
            if (task_type, index) != (self.task_type, self.task_index)
        }


LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


def cluster_hosts(text: str) -> list[str]:
    """The hosts a TF_CONFIG's cluster names (empty when it names none readably: its parser says what is wrong)."""
    try:
        cluster = documents.parse(text, "TF_CONFIG", documents.ANY_OBJECT, "cluster description").get("cluster")
    except documents.DocumentError:
        return []
    addresses = [address for value in (cluster or {}).values() if isinstance(value, list) for address in value]
    return sorted({str(address).rpartition(":")[0] for address in addresses if isinstance(address, str)})


def is_local_host(host: str) -> bool:
    return host in LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname()


def parse_tf_config(text: str | None, expected_workers: int) -> Cluster | None:
    """The cluster TF_CONFIG describes, checked against `expected_workers`; None when TF_CONFIG is empty."""
    if not text or not text.strip():
        if expected_workers > 1:
            raise ClusterError(
                f"TF_CONFIG is empty but {expected_workers} workers were asked for: this process would train "
                "alone. Start the workers with the local, trainjob or tfjob launcher, or set TF_CONFIG."
            )
        return None
    try:
        config = documents.parse(text, "TF_CONFIG", documents.ANY_OBJECT, "cluster description")
    except documents.DocumentError as error:
        raise ClusterError(f"{error} (a JSON object with 'cluster' and 'task')") from error
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError("TF_CONFIG has no 'cluster' object (task type -> list of host:port)")
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(
            isinstance(address, str) and ":" in address for address in addresses
        ):
            raise ClusterError(
                f"TF_CONFIG cluster[{task_type!r}] must be a list of 'host:port' strings, got {addresses!r}"
            )
    unknown = sorted(set(cluster) - {"chief", "worker", "evaluator"})
    if unknown:
        raise ClusterError(f"TF_CONFIG cluster has task types {unknown}; only chief, worker and evaluator are used")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterError("TF_CONFIG has no 'task' object with 'type' and 'index'")
    task_type, task_index = task["type"], task["index"]
    if task_type not in cluster:
        raise ClusterError(f"TF_CONFIG task type {task_type!r} is not in the cluster {sorted(cluster)}")
    if isinstance(task_index, bool) or not isinstance(task_index, int) or not 0 <= task_index < len(cluster[task_type]):
        raise ClusterError(
            f"TF_CONFIG task index {task_index!r} is out of range: cluster[{task_type!r}] has "
            f"{len(cluster[task_type])} address(es)"
        )
    listed = [address for addresses in cluster.values() for address in addresses]
    twice = sorted({address for address in listed if listed.count(address) > 1})
    if twice:
        raise ClusterError(
            f"TF_CONFIG lists {', '.join(twice)} more than once: every task needs an address of its own (two tasks "
            "cannot both listen there, and the cluster would wait for ever for the second)"
        )
    result = Cluster({key: list(value) for key, value in cluster.items()}, task_type, task_index)
    if result.size != expected_workers:
        raise ClusterError(
            f"TF_CONFIG describes {result.size} training worker(s) but --workers is {expected_workers}; "
            "refusing to train with a different cluster than the one asked for"
        )
    return result


def has_jobset_identity(environment=None) -> bool:
    environment = os.environ if environment is None else environment
    return bool(environment.get(TRAINJOB_NAME))


def tf_config_from_jobset(environment, expected_workers: int) -> str:
    """TF_CONFIG for a TrainJob's pod, from its job's name and size (the TrainJob's env) and its completion index
    (set by Kubernetes), checked like TF_CONFIG itself: the sizes agree, the index is in range."""
    name = environment.get(TRAINJOB_NAME, "")
    index_text = environment.get(JOB_COMPLETION_INDEX, "")
    nodes_text = environment.get(TRAINJOB_NUM_NODES, "")
    if not index_text.isdigit():
        raise ClusterError(
            f"{TRAINJOB_NAME} is set ({name!r}) but {JOB_COMPLETION_INDEX} is {index_text!r}, not a worker index: "
            "this pod is not one of an Indexed Job's (run it through the cifar10-pipeline TrainJob runtime)"
        )
    if not nodes_text.isdigit() or int(nodes_text) != expected_workers:
        raise ClusterError(
            f"the TrainJob has {nodes_text or 'an unknown number of'} node(s) ({TRAINJOB_NUM_NODES}) but --workers is "
            f"{expected_workers}; refusing to train with a different cluster than the one asked for"
        )
    index = int(index_text)
    if index >= expected_workers:
        raise ClusterError(f"{JOB_COMPLETION_INDEX} {index} is out of range for {expected_workers} workers")
    addresses = [f"{name}-node-0-{worker}.{name}:{WORKER_PORT}" for worker in range(expected_workers)]
    mapping = documents.load(environment.get(ADDRESS_MAP) or "{}", ADDRESS_MAP, "address map", yaml_allowed=False)
    if not isinstance(mapping, dict):
        raise ClusterError(f"{ADDRESS_MAP}: expected a JSON object of address to address")
    addresses = [mapping.get(address, address) for address in addresses]
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def cluster_from_environment(expected_workers: int) -> Cluster | None:
    """The cluster this process is a worker of: TF_CONFIG when set, else a TrainJob pod's identity, else None."""
    text = os.environ.get(TF_CONFIG)
    if not (text and text.strip()) and has_jobset_identity():
        text = tf_config_from_jobset(os.environ, expected_workers)
        os.environ[TF_CONFIG] = text  # MultiWorkerMirroredStrategy reads it from the environment
        logger.info("TF_CONFIG from the TrainJob's pod identity: %s", text)
    return parse_tf_config(text, expected_workers)


class PeersMissingError(RuntimeError):
    """Some workers of the cluster did not start within the allowed time."""


def _serve_presence(listener: socket.socket, stop: threading.Event) -> None:
    """Accept probes on our own address until told to stop; the prober closes first, so that the port is left
    with no connection in TIME_WAIT on our side when TensorFlow binds it."""
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            connection, _ = listener.accept()
        except (TimeoutError, OSError):
            continue
        with connection:
            connection.settimeout(5)
            with contextlib.suppress(OSError):
                connection.recv(1)


def _reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    return filesystem.can_connect(host, int(port), timeout=1.0)  # a name that does not resolve yet is False too


def wait_for_peers(cluster: Cluster, timeout_seconds: float, between_attempts: Callable[[], None]) -> None:
    """Before TensorFlow forms the cluster (which waits for the peers without a bound, holding the GIL): make
    sure every peer has started, or fail after `timeout_seconds` naming the ones that did not.

    Each worker listens on its own address until it has reached every peer there (a peer that already went on
    answers through TensorFlow's server on the same port). `between_attempts` runs between probes (it raises to
    stop waiting, e.g. on SIGTERM)."""
    peers = cluster.peers()
    _host, port = cluster.address.rsplit(":", 1)
    stop = threading.Event()
    try:
        listener = socket.create_server(("", int(port)))
    except OSError as error:
        raise ClusterError(f"{cluster.name}: cannot listen on {cluster.address} ({error.strerror})") from error
    server = threading.Thread(target=_serve_presence, args=(listener, stop), name="presence", daemon=True)
    server.start()
    missing = dict(peers)
    deadline = time.monotonic() + timeout_seconds
    logger.info("%s: waiting for %s", cluster.name, ", ".join(sorted(peers)))
    try:
        while missing:
            missing = {name: address for name, address in missing.items() if not _reachable(address)}
            if not missing:
                break
            if time.monotonic() > deadline:
                described = ", ".join(f"{name} ({address})" for name, address in sorted(missing.items()))
                raise PeersMissingError(
                    f"{cluster.name}: gave up after {timeout_seconds:g} s waiting for {described} to start; check "
                    "that those workers were scheduled and are running (or raise --peer-timeout-seconds; in a "
                    "pipeline, train_options' peer_timeout_seconds)"
                )
            between_attempts()
            time.sleep(0.2)
    finally:
        stop.set()
        server.join()
        listener.close()
    logger.info("%s: all %d workers have started", cluster.name, len(peers) + 1)


def broadcast_from_chief(strategy, values: list) -> list:
    """`values` (arrays) as the first replica of the chief holds them, on every worker: one all-reduce in which every
    other replica contributes zeros. Every worker must call it at the same point."""
    import tensorflow as tf

    def replica_function(*tensors):
        context = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tensors[0].dtype)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, [tensor * first for tensor in tensors])

    @tf.function  # strategy.run eagerly works too, but TensorFlow then warns of "significant overhead"
    def broadcast(*tensors):
        return strategy.run(replica_function, args=tensors)

    results = broadcast(*(tf.constant(value, tf.float32) for value in values))
    return [strategy.experimental_local_results(result)[0].numpy() for result in results]


END_OF_TRAINING_BARRIER = "cifar10-pipeline/end-of-training"
END_OF_TRAINING_TIMEOUT_SECONDS = 120


def wait_for_every_worker_to_finish(cluster: Cluster | None) -> None:
    """At the end of a multi-worker run: every worker waits until all have finished (the coordination service's
    barrier), so that they can all leave at once (`leave_in_order`)."""
    global _FINISHED_TOGETHER
    if cluster is None or cluster.size < 2:
        return
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(END_OF_TRAINING_BARRIER, END_OF_TRAINING_TIMEOUT_SECONDS * 1000)
    _FINISHED_TOGETHER = cluster


_FINISHED_TOGETHER: Cluster | None = None  # the cluster whose end-of-training barrier this worker passed
LEAVING_BARRIER = "cifar10-pipeline/leaving"
LEAVE_GRACE_SECONDS = 0.5
LEAVE_WAIT_SECONDS = 10.0  # how long a worker waits for the others at the leaving barrier; then it leaves anyway


def leave_in_order() -> None:
    """Just before a worker that finished with the others exits: the chief, whose process hosts the coordination
    service, leaves last. A worker that outlived the service would find its heartbeat refused and abort with
    "StartAbort UNAVAILABLE ... coordination service" (on a loaded machine, where the chief's exit can be the
    quicker), or wait out the heartbeat timeout. So all meet at a last barrier right before exiting (the caller's
    os._exit follows within milliseconds), and the chief then waits a moment more. Saying goodbye never changes how
    training ended: a barrier that fails or times out is logged, and the worker leaves with its own exit code.

    (A record per worker that the chief read with a blocking get was tried first: inside a kfp.local step, a worker's
    record then waited behind the chief's get until it timed out, and the worker failed with "Connection reset".)"""
    cluster = _FINISHED_TOGETHER
    if cluster is None:
        return
    from tensorflow.python.eager import context

    try:
        context.context().wait_at_barrier(LEAVING_BARRIER, int(LEAVE_WAIT_SECONDS * 1000))
    except Exception as error:  # a peer that died after the end of training, or a service already gone
        logger.warning("leaving without the others (%s)", str(error).splitlines()[0][:200])
        return
    if cluster.is_chief:
        time.sleep(LEAVE_GRACE_SECONDS)  # the others' exits follow the barrier within milliseconds


def communication_options(gpus: int):
    """How the workers sum their gradients (docs/benchmarks.md, "Multi-worker training on paper"): NCCL's ring
    between GPUs (the collective ring between CPUs), every gradient in one pack (bytes_per_pack 0: one all-reduce a
    step; ResNet-20's 59 tensors reduced one by one would take 59 times the ring's 2 (N - 1) latency-bound hops, 20 ms
    a step at 8 workers, more than its computation), and no timeout (a slow peer is the step lease's to judge)."""
    import tensorflow as tf

    implementations = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=0, implementation=implementations.NCCL if gpus else implementations.RING
    )


def create_strategy(cluster: Cluster | None):
    import tensorflow as tf

    if cluster is not None and cluster.size > 1:
        gpus = len(tf.config.list_physical_devices("GPU"))
        options = communication_options(gpus)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        logger.info("MultiWorkerMirroredStrategy: %s of %d workers, gradients summed by %s in one all-reduce a step",
                    cluster.name, cluster.size, options.implementation.value)  # fmt: skip
        return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        logger.info("MirroredStrategy over %d GPUs", len(gpus))
        return tf.distribute.MirroredStrategy()
    logger.info("single device: %s", gpus[0].name if gpus else "CPU")
    return tf.distribute.get_strategy()
