"""Each private API the project relies on, checked against the installed pin: when a pin moves and the symbol moved
with it, the test fails naming the symbol, where the project uses it and the pin it was written against.

They are used because no public API does the same (the reasons are beside each use):
- kfp.local's orchestrator entry point and its run-folder naming (pipeline/local_run.py: the run's folder known
  before it starts, steps' failures read as such);
- kfp.local's subprocess runner's process start (pipeline/step_processes.py: each step in a process group that
  local-run owns);
- kfp.local's Docker runner's container start (pipeline/step_processes.py: each step's container owned by local-run,
  its exit code read before it is removed, which kfp 2.17 gets wrong);
- TensorFlow's coordination-service barrier (components/train/distribution.py: workers leave together);
- Keras's per-variable optimizer step (components/train/step.py: the update applied to all-reduced gradients
  inside the distribution strategy's merge call).
"""

from __future__ import annotations

import importlib.metadata
import inspect

import pytest

PINS = {"kfp": "2.17.0", "tensorflow-cpu": "2.21.0", "keras": "3.15.1"}


def moved(symbol: str, user: str, package: str, detail: str) -> str:
    installed = importlib.metadata.version(package)
    return (
        f"private API {symbol} (used by {user}) moved: {detail}; written against {package}=={PINS[package]}, "
        f"installed {package}=={installed}"
    )


def parameters_of(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_pins_are_the_ones_these_checks_were_written_against():
    for package, pin in PINS.items():
        assert importlib.metadata.version(package) == pin, moved("(all below)", "the project", package, "pin changed")


def test_kfp_local_orchestrator_entry_point_and_run_naming():
    from kfp.local import executor_input_utils, pipeline_orchestrator

    user = "pipeline/local_run.py local_run"
    run = getattr(pipeline_orchestrator, "run_local_pipeline", None)
    assert run is not None, moved("kfp.local.pipeline_orchestrator.run_local_pipeline", user, "kfp", "gone")
    assert parameters_of(run) == ["pipeline_spec", "arguments"], moved(
        "kfp.local.pipeline_orchestrator.run_local_pipeline", user, "kfp", f"parameters {parameters_of(run)}"
    )
    naming = getattr(executor_input_utils, "get_local_pipeline_resource_name", None)
    symbol = "kfp.local.executor_input_utils.get_local_pipeline_resource_name"
    assert naming is not None, moved(symbol, "pipeline/local_run.py _run_named", "kfp", "gone")
    assert naming("my-pipeline").startswith("my-pipeline-"), moved(symbol, user, "kfp", "the name's form changed")
    source = inspect.getsource(pipeline_orchestrator)
    assert "finished with status" in source, moved(
        "kfp.local's 'finished with status' failure message", user, "kfp", "the failure is reported otherwise"
    )


def test_kfp_local_docker_runner_starts_containers_through_a_replaceable_module_function():
    from kfp.local import docker_task_handler

    user = "pipeline/step_processes.py StepProcesses.run_container"
    symbol = "kfp.local.docker_task_handler.run_docker_container"
    start = getattr(docker_task_handler, "run_docker_container", None)
    assert start is not None, moved(symbol, user, "kfp", "gone")
    assert parameters_of(start)[:4] == ["client", "image", "command", "volumes"], moved(
        symbol, user, "kfp", f"parameters {parameters_of(start)}"
    )
    handler = inspect.getsource(docker_task_handler.DockerTaskHandler)
    assert "run_docker_container(" in handler and "client=client" in handler, moved(
        symbol, user, "kfp", "DockerTaskHandler no longer calls it by its module name, so replacing it does nothing"
    )
    tag = getattr(docker_task_handler, "add_latest_tag_if_not_present", None)
    assert tag is not None and tag(image="x") == "x:latest", moved(
        "kfp.local.docker_task_handler.add_latest_tag_if_not_present", user, "kfp", "gone or changed"
    )


def test_tensorflows_coordination_barrier():
    from tensorflow.python.eager import context

    symbol = "tensorflow.python.eager.context.Context.wait_at_barrier"
    user = "components/train/distribution.py wait_for_every_worker_to_finish, leave_in_order"
    barrier = getattr(context.Context, "wait_at_barrier", None)
    assert barrier is not None, moved(symbol, user, "tensorflow-cpu", "gone")
    assert parameters_of(barrier) == ["self", "barrier_id", "timeout_in_ms"], moved(
        symbol, user, "tensorflow-cpu", f"parameters {parameters_of(barrier)}"
    )


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_keras_per_variable_update_step(name):
    import keras
    import numpy as np

    symbol = f"keras.optimizers.{name}.update_step"
    user = "components/train/step.py (the update of all-reduced gradients)"
    optimizer = getattr(keras.optimizers, name)(learning_rate=0.5)
    assert parameters_of(optimizer.update_step) == ["gradient", "variable", "learning_rate"], moved(
        symbol, user, "keras", f"parameters {parameters_of(optimizer.update_step)}"
    )
    variable = keras.Variable(np.ones(3, dtype="float32"))
    optimizer.build([variable])
    optimizer.update_step(keras.ops.ones(3), variable, 0.5)
    assert np.all(np.asarray(variable) < 1.0), moved(symbol, user, "keras", "the step no longer moves the variable")


def test_kfp_local_starts_subprocess_steps_through_its_modules_subprocess_popen():
    from kfp.local import subprocess_task_handler

    symbol = "kfp.local.subprocess_task_handler.subprocess.Popen"
    user = "pipeline/step_processes.py StepProcesses.supervised"
    assert getattr(subprocess_task_handler, "subprocess", None) is not None, moved(symbol, user, "kfp", "gone")
    source = inspect.getsource(subprocess_task_handler)
    assert "subprocess.Popen(" in source, moved(
        symbol, user, "kfp", "steps are no longer started by the module's subprocess.Popen, so they are not owned"
    )
