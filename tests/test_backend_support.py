"""What each KFP backend release runs: every compiled pipeline (training, sweep, predict; with and without the prepare
fan-out) against the table of IR constructs read from kubeflow/pipelines' backend at each release's tag
(pipeline/backend_support.py), the table docs/cluster.md shows, and submissions to a stand-in naming each release."""

import re
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl, kubernetes

from pipeline import backend_support, commands
from pipeline.predict_pipeline import predict_pipeline
from pipeline.sweep_pipeline import cifar10_sweep
from pipeline.training_pipeline import cifar10_pipeline
from tests.fake_kfp_api import API, FakeKfpApi

REPOSITORY = Path(__file__).resolve().parents[1]
PIPELINES = {"training": cifar10_pipeline, "sweep": cifar10_sweep, "predict": predict_pipeline}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    """{name: the YAML documents} of every pipeline users can compile: the kept files under pipeline/ and the
    fan-out variants (`compile --prepare-fan-out`)."""
    folder = tmp_path_factory.mktemp("compiled")
    documents = {name: list(yaml.safe_load_all(commands.compiled_path(p).read_text())) for name, p in PIPELINES.items()}
    for name in ("training", "sweep"):
        output = folder / f"{name}-fan-out.yaml"
        assert commands.main(PIPELINES[name], ["compile", "--prepare-fan-out", "--output", str(output)]) == 0
        documents[f"{name} with --prepare-fan-out"] = list(yaml.safe_load_all(output.read_text()))
    return documents


def docs_table() -> dict[str, set[str]]:
    """{KFP version: the pipelines docs/cluster.md says it runs} from its table of backends."""
    text = (REPOSITORY / "docs" / "cluster.md").read_text()
    section = text[text.index("| KFP backend | Kubeflow | runs |") :].split("\n\n")[0]
    table = {}
    for row in section.splitlines()[2:]:
        version, _kubeflow, runs = (cell.strip() for cell in row.strip("|").split("|")[:3])
        table[version.strip("`")] = {name.strip() for name in re.sub(r"\(.*?\)", "", runs).split(",") if name.strip()}
        table[version.strip("`")].discard("nothing")
    return table


def runnable_on(documents: dict[str, list[dict]], version: str) -> set[str]:
    return {
        name
        for name, document in documents.items()
        if not backend_support.problems(backend_support.constructs_used(document), version)[0]
    }


@pytest.mark.parametrize("version", backend_support.RELEASES)
def test_each_release_runs_exactly_the_pipelines_the_docs_table_says(compiled, version):
    assert set(docs_table()) == set(backend_support.RELEASES)
    assert runnable_on(compiled, version) == docs_table()[version]


def test_every_construct_a_compiled_pipeline_uses_is_in_the_table_and_the_default_ones_run_on_kubeflow_1_10(compiled):
    for name, documents in compiled.items():
        used = backend_support.constructs_used(documents)
        assert set(used) <= set(backend_support.CONSTRUCTS), (name, set(used) - set(backend_support.CONSTRUCTS))
        oldest = backend_support.oldest_release(documents)
        assert oldest == ("2.15.0" if "fan-out" in name else "2.5.0"), name
        # none of them uses what no release runs, nor the shapes that broke on 2.15 (a named loop)
        assert not {"loop-in-exit-handler", "named-loop", "task-final-status"} & set(used), name
    assert "collected-parameters" in backend_support.constructs_used(compiled["training with --prepare-fan-out"])
    assert "parallel-for" not in backend_support.constructs_used(compiled["training"])


def test_every_constructs_source_names_a_file_and_line_at_a_release_tag():
    for name, construct in backend_support.CONSTRUCTS.items():
        assert construct.since == backend_support.NEVER or backend_support.version_key(construct.since), name
        cited = re.findall(r"(\d+\.\d+\.\d+):backend/\S+\.go:(\d+)", construct.source)
        assert cited or "#" in construct.source, name  # a file and line at a tag, or the upstream issue
        assert not construct.fails or construct.since == "2.3.0" or construct.older, name


def compile_small(pipeline, tmp_path: Path) -> list[dict]:
    path = tmp_path / "small.yaml"
    compiler.Compiler().compile(pipeline, str(path))
    return list(yaml.safe_load_all(path.read_text()))


@dsl.component(base_image="python:3.11")
def numbers(count: int) -> list:
    return list(range(count))


@dsl.component(base_image="python:3.11")
def square(number: int) -> int:
    return number * number


@dsl.component(base_image="python:3.11")
def total(values: list) -> float:
    return sum(values)


@dsl.component(base_image="python:3.11")
def report(status: dsl.PipelineTaskFinalStatus):
    print(status.state)


def test_the_shapes_that_break_older_backends_are_found(tmp_path):
    @dsl.pipeline(name="shapes")
    def shapes(count: int = 3):
        items = numbers(count=count).set_display_name("list the numbers")
        with dsl.ExitHandler(report()):
            with dsl.ParallelFor(items.output, name="squares") as number:
                squared = square(number=number)
            total(values=dsl.Collected(squared.output))

    used = backend_support.constructs_used(compile_small(shapes, tmp_path))
    for construct in ("display-name-on-producer", "named-loop", "loop-in-exit-handler", "collected-parameters",
                      "task-final-status", "parallel-for", "exit-handler"):  # fmt: skip
        assert construct in used, construct
    for version in backend_support.RELEASES:  # a ParallelFor inside an ExitHandler: no release
        failing, _ignored = backend_support.problems(used, version)
        assert any("inside an ExitHandler" in sentence and "#12390" in sentence for sentence in failing)


def test_the_same_graph_without_them_runs_from_the_release_that_collects(tmp_path):
    @dsl.pipeline(name="shapes")
    def shapes(count: int = 3):
        items = numbers(count=count)
        with dsl.ParallelFor(items.output) as number:
            squared = square(number=number).set_display_name("square it")  # read through the loop's outputs
        total(values=dsl.Collected(squared.output)).set_display_name("add them")  # read by nobody

    documents = compile_small(shapes, tmp_path)
    named = backend_support.constructs_used(documents)["display-name-on-producer"]
    assert named == ["comp-for-loop-1/square ('square it')"]  # not total's: nobody reads it
    assert backend_support.oldest_release(documents) == "2.15.0"
    failing, _ = backend_support.problems(backend_support.constructs_used(documents), "2.14.0")
    assert failing == []  # the first version that collects, though no Kubeflow release ships it


def test_a_kfp_kubernetes_field_nobody_read_is_refused_on_every_release(tmp_path):
    @dsl.pipeline(name="selector")
    def selector():
        kubernetes.add_node_selector(square(number=2), label_key="pool", label_value="gpu")

    used = backend_support.constructs_used(compile_small(selector, tmp_path))
    for version in backend_support.RELEASES:
        failing, _ = backend_support.problems(used, version)
        assert failing and "nodeSelector" in failing[0] and "table" in failing[0]


@pytest.mark.parametrize(
    ("version", "arguments", "refused"),
    [
        ("2.3.0", [], r"KFP 2\.3\.0 \(Kubeflow 1\.9\.1\), which cannot run this pipeline: .*needs KFP 2\.5\.0 or "),
        ("2.5.0", ["--prepare-fan-out"], r"KFP 2\.5\.0 .*dsl\.Collected.*needs KFP 2\.15\.0 or newer"),
        ("2.14.4", ["--prepare-fan-out"], None),
        ("2.5.0", [], None),
        ("2.15.0", ["--prepare-fan-out"], None),
    ],
)
def test_a_run_the_backend_cannot_run_is_refused_in_one_line_before_anything_is_sent(
    capsys, version, arguments, refused
):
    with FakeKfpApi(backend_version=version) as kfp_api:
        code = commands.main(
            cifar10_pipeline,
            ["run", "--host", kfp_api.url, "--source", "s3://bucket/data.tar.gz", "--prepare-workers", "3", *arguments],
        )
        runs = kfp_api.bodies("POST", f"{API}/runs")
    error = capsys.readouterr().err
    if refused:
        assert code == 2 and runs == [] and kfp_api.bodies("POST", f"{API}/experiments") == []
        (line,) = [line for line in error.splitlines() if "ERROR" in line]
        assert re.search(refused, line), line
        return
    assert code == 0, error
    (run,) = runs
    sent = run["pipeline_spec"]["pipeline_spec"]
    fanned = any("parameterIterator" in task for task in _tasks(sent))
    assert fanned == bool(arguments)
    assert run["runtime_config"]["parameters"]["prepare_workers"] == 3
    if version == "2.5.0":  # runs, without what 2.5 ignores: said
        assert "KFP 2.5.0 runs this pipeline without use_secret_as_env / use_config_map_as_env" in error


def test_a_schedule_the_backend_cannot_run_creates_no_experiment(capsys):
    with FakeKfpApi(backend_version="2.5.0") as kfp_api:
        code = commands.main(
            cifar10_pipeline,
            ["schedule", "--host", kfp_api.url, "--cron", "0 0 3 * * *", "--promotion-root", "s3://bkb/models",
             "--prepare-fan-out"],
        )  # fmt: skip
        assert code == 2
        assert kfp_api.bodies("POST", f"{API}/experiments") == []
        assert kfp_api.bodies("POST", f"{API}/recurringruns") == []
    assert "needs KFP 2.15.0 or newer" in capsys.readouterr().err


def test_the_stand_in_plays_an_older_backends_refusal_of_the_exit_status(tmp_path):
    """The stand-in refuses what KFP 2.5's Argo compiler refuses, so the project's check is not the only guard."""
    import kfp

    @dsl.pipeline(name="with-status")
    def with_status():
        with dsl.ExitHandler(report()):
            square(number=2)

    package = tmp_path / "with-status.yaml"
    compiler.Compiler().compile(with_status, str(package))
    with FakeKfpApi(backend_version="2.5.0") as kfp_api:
        client = kfp.Client(host=kfp_api.url)
        with pytest.raises(Exception, match="task final status not supported yet"):
            client.create_run_from_pipeline_package(str(package), arguments={}, experiment_name="e")


def test_a_backend_that_names_no_version_is_warned_about_not_refused(capsys):
    with FakeKfpApi(backend_version="unknown") as kfp_api:
        code = commands.main(cifar10_pipeline, ["run", "--host", kfp_api.url, "--source", "s3://bucket/d.tar.gz"])
    assert code == 0
    assert "does not name its version ('unknown'): this pipeline needs 2.5.0 or newer" in capsys.readouterr().err


def _tasks(spec: dict) -> list[dict]:
    dags = [spec["root"]["dag"]] + [c["dag"] for c in spec.get("components", {}).values() if "dag" in c]
    return [task for dag in dags for task in dag["tasks"].values()]
