"""Choosing how training runs: in this process, as local worker processes, as a Kubernetes job (TrainJob or TFJob),
or as one worker of such a job.

auto: TF_CONFIG (or a TrainJob pod's identity) set -> this process is one worker; workers == 1 -> in-process; in a
Kubernetes pod -> the job kind the cluster serves; otherwise local processes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys

from components.common import exit_codes, filesystem
from components.common.config import changed_fields, setting_words
from components.train.config import CLUSTER_LAUNCHERS, TrainConfig
from components.train.launch_config import LaunchConfig

logger = logging.getLogger(__name__)

# What serves each job kind: (group, version, resource), probed through the API's discovery.
SERVED_BY = {"trainjob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"), "tfjob": ("kubeflow.org", "v1", "tfjobs")}
NEITHER_SERVED = (
    "this cluster serves neither Kubeflow Trainer v2 TrainJobs (trainer.kubeflow.org/v1alpha1) nor training-operator "
    "TFJobs (kubeflow.org/v1), so multi-worker training has nothing to run on: install Kubeflow Trainer v2.3 (the "
    "default of Kubeflow 1.11 and later) and apply manifests/admin/trainer/ once, or run with launcher=pod to train "
    "inside the step's own pod"
)


def served_job_kinds(custom_objects_api) -> list[str]:
    """The job kinds the cluster's API serves, TrainJob first (the current operator), from its discovery."""
    from components.train.cluster_job import status_of

    served = []
    for kind, (group, version, resource) in SERVED_BY.items():
        try:
            resources = custom_objects_api.get_api_resources(group, version)
        except Exception as error:
            if status_of(error) == 404:
                continue
            raise
        if resource in {item.name for item in (resources.resources or [])}:
            served.append(kind)
    return served


def cluster_job_kind(custom_objects_api=None) -> str:
    """trainjob where the cluster serves TrainJobs, tfjob where it serves only TFJobs; ValueError naming what to
    install where it serves neither."""
    if custom_objects_api is None:
        from components.train.cluster_job import kubernetes_apis

        custom_objects_api, _core = kubernetes_apis()
    served = served_job_kinds(custom_objects_api)
    if not served:
        raise ValueError(NEITHER_SERVED)
    logger.info("the cluster serves %s: launching a %s", " and ".join(served), served[0])
    return served[0]


def choose_launcher(config: TrainConfig) -> str:
    from components.train import distribution
    from components.train.cluster_job import in_kubernetes_pod
    from components.train.distribution import TF_CONFIG, has_jobset_identity

    from_environment = os.environ.get(TF_CONFIG, "").strip()
    if config.launcher != "auto":
        if from_environment and config.launcher not in ("worker", *CLUSTER_LAUNCHERS):
            logger.info("TF_CONFIG is set in the environment; --launcher %s does not use it", config.launcher)
        return config.launcher
    if from_environment:
        hosts = distribution.cluster_hosts(from_environment)
        logger.info("TF_CONFIG from the environment: this process joins the cluster it names (%s)", ", ".join(hosts))
        elsewhere = [host for host in hosts if not distribution.is_local_host(host)]
        if elsewhere and not in_kubernetes_pod() and not has_jobset_identity():
            raise ValueError(
                f"TF_CONFIG in the environment names hosts of another machine ({', '.join(elsewhere[:3])}): this "
                f"run would join that cluster instead of starting --workers {config.workers} here. Unset TF_CONFIG, "
                "or say which: --launcher worker (join it) or --launcher local (ignore it)"
            )
        return "worker"
    if has_jobset_identity():
        return "worker"
    if config.workers == 1:
        return "inprocess"
    return cluster_job_kind() if in_kubernetes_pod() else "local"


def check_launch_used(launcher: str, chosen_by: str, launch: LaunchConfig | None) -> None:
    """A cluster job's setting (the workers' pods, the job's timeouts, its runtime...) given to a launcher that starts
    no job would be ignored: refused, naming it."""
    if launch is None or launcher in CLUSTER_LAUNCHERS:
        return
    given = changed_fields(launch, [field.name for field in dataclasses.fields(launch)])
    if given:
        how = f"launcher {launcher}" if chosen_by == launcher else f"launcher {chosen_by} (here: {launcher})"
        options = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        setting, them = setting_words(given)
        raise ValueError(
            f"{options}: {setting} of a cluster job (launcher trainjob or tfjob), and {how} starts none: it trains on "
            f"this machine; leave {them} out"
        )


def run(config: TrainConfig, launch: LaunchConfig | None = None, refuse_unused_launch: bool = False) -> int:
    """Train as `config` says; the exit code (0 done, 1 failed for good, 143 preempted: a retry resumes).
    `refuse_unused_launch`: `launch` holds what a person gave (the command line), so a cluster job's setting there
    with a launcher that starts none is refused (a pipeline's step passes the pipeline's job settings whatever the
    launcher: its parameters are checked at submission instead)."""
    from components.common import compiled_kernels, file_errors
    from components.common.filesystem import apply_single_writer_option, is_remote

    compiled_kernels.mode()  # a bad CIFAR10_PIPELINE_COMPILED_KERNELS is refused before anything starts
    apply_single_writer_option(config.assume_single_writer)
    launcher = choose_launcher(config)
    if refuse_unused_launch:
        check_launch_used(launcher, config.launcher, launch)
    if launcher not in CLUSTER_LAUNCHERS and not is_remote(config.model_dir):
        file_errors.check_writable(config.model_dir, "model_dir")  # before TensorFlow and the data are set up
    if launcher in ("local", *CLUSTER_LAUNCHERS):
        # These launch and watch; their own handlers pass SIGTERM and SIGINT on or delete the job. (The block
        # `python -m components.train` starts with is for the processes that train; see termination.py.)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    if launcher == "local":
        from components.train.launch_local import launch_local, processes_problem

        problem = processes_problem(config.workers, "workers")
        if problem:
            raise ValueError(problem)
        return launch_local(config)
    if launcher in CLUSTER_LAUNCHERS:
        return run_cluster_job(launcher, config, launch or LaunchConfig())
    from components.train import supervisor, termination

    if launcher == "worker" and not supervisor.is_supervised():
        from components.train.launch_local import die_with_launcher, worker_command

        die_with_launcher()
        return supervisor.Supervisor(worker_command(config), config.peer_timeout_seconds).run()
    termination.block_for_this_process()  # before TensorFlow starts a thread: see termination.py
    from components.train.distribution import PeersMissingError
    from components.train.loop import NumericsError, train

    try:
        result = train(config)
    except termination.Terminated as stopped:
        logger.warning("%s: exiting with %d so that a retry resumes", stopped, exit_codes.PREEMPTED)
        code = exit_codes.PREEMPTED
    except (NumericsError, PeersMissingError) as error:
        logger.error("%s", error)
        code = exit_codes.FAILED
    else:
        code = exit_codes.PREEMPTED if result.preempted else exit_codes.SUCCESS  # stopped early by Katib: 0
        if result.stopped_early:
            logger.info("stopped early by Katib at step %d (checkpoint saved): exit 0, not to be retried", result.step)
    if launcher == "worker":
        leave_at_once(code)
    return code


def leave_at_once(code: int) -> None:
    """End a worker of a cluster now: everything it writes is written (atomically, and synced), and TensorFlow's
    teardown of a cluster's runtime can take half a minute of heartbeats to a service that is gone."""
    if code == exit_codes.SUCCESS:
        from components.train.distribution import leave_in_order

        leave_in_order()  # the chief, host of the cluster's coordination service, last
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def run_cluster_job(launcher: str, config: TrainConfig, launch: LaunchConfig) -> int:
    from components.train.cluster_job import Cancelled, JobError, kubernetes_apis

    custom, core = kubernetes_apis()
    if launcher == "trainjob":
        from components.train.launch_trainjob import trainjob_launcher as make_launcher
    else:
        from components.train.launch_tfjob import tfjob_launcher as make_launcher
    try:
        make_launcher(custom, core).run(config, launch)
    except JobError as error:
        logger.error("%s", error)
        return exit_codes.FAILED
    except Cancelled:
        return exit_codes.PREEMPTED
    return exit_codes.SUCCESS


def run_permissions(launcher: str, locations: list[str], api_client) -> list:
    """What a run with `launcher` that writes to `locations` (and the namespace's pipeline root) needs of the
    Kubernetes API: the job kind it launches, and Leases where a store cannot compare-and-swap."""
    from kubernetes import client

    from components.common import access, kfp_launcher, object_stores

    permissions = []
    if launcher in CLUSTER_LAUNCHERS:
        permissions += access.job_permissions(launcher) + access.step_lease_permissions()
    elif launcher == "auto":  # the kind the cluster serves (none: the train step says what to install)
        served = served_job_kinds(client.CustomObjectsApi(api_client))
        permissions += access.job_permissions(served[0]) + access.step_lease_permissions() if served else []
    roots = [location for location in locations if filesystem.is_s3_uri(location)]
    modes = [object_stores.store_mode(object_stores.S3Publisher(root)) for root in roots]
    default_root = kfp_launcher.default_pipeline_root()
    if filesystem.is_s3_uri(default_root):
        try:
            modes.append(object_stores.store_mode(object_stores.S3Publisher(default_root)))
        except filesystem.StorageError as error:  # its steps will say so; the question here is only the Leases
            logger.info("access: the pipeline root %s could not be checked (%s)", default_root, error)
    if object_stores.KUBERNETES in modes:
        permissions += access.lease_permissions()
    return list(dict.fromkeys(permissions))  # each asked once


def check_access(launcher: str, locations: list[str]) -> None:
    """The run's first step, before any data is read: the API server is asked whether this pod's service account
    holds what the run will need (components/common/access.py); outside a pod there is nothing to ask."""
    from components.common import access, coordination

    if not coordination.available():
        logger.debug("access: not in a Kubernetes pod, nothing to ask")
        return
    api_client, namespace = coordination.in_cluster_client()
    permissions = run_permissions(launcher, [location for location in locations if location], api_client)
    access.check(api_client, namespace, coordination.service_account_name(), permissions, coordination.call)
