"""The prepare_data KFP component: a lightweight Python component whose image holds this project.

The body only imports the project and calls one function, so the same definition runs in-process with
`kfp.local.SubprocessRunner`, in Docker, and on a cluster.
"""

from kfp import dsl

from components.images import image


@dsl.component(base_image=image("prepare_data"), install_kfp_package=False)
def prepare_data_component(
    dataset: dsl.Output[dsl.Dataset],
    statistics: dsl.Output[dsl.Markdown],
    source: str = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    source_sha256: str = "",
    validation_fraction: float = -1.0,
    leakage: str = "keep",
    examples_per_shard: int = 5000,
    compression: str = "NONE",
    resize: str = "",
    seed: int = 42,
    synthetic_train_per_class: int = 200,
    synthetic_eval_per_class: int = 50,
    max_source_megabytes: int = 1024,
    source_fingerprint: str = "",
    prepare_workers: int = 1,
    parts: list = [],  # noqa: B006 (KFP parameters take literal defaults)
):
    """Convert the source to sharded, checksummed TFRecords in the `dataset` artifact.

    validation_fraction < 0 keeps the source's own hold-out (data batch 5); source_sha256 "" checks
    only the official archive's known digest; resize "HxW" resizes every image ("": the images' own size); leakage
    "drop_from_train" or "drop_from_eval" removes test images' near-duplicates from training or the test images;
    max_source_megabytes bounds what the source may unpack to (the step's memory must go with it).
    `statistics` shows the dataset's statistics.json (class balance, channels, sizes, duplicates and leakage).
    source_fingerprint is only for caching: pass the output of source_fingerprint_component so that a cached
    result is reused only for unchanged source content. prepare_workers > 1: without `parts`, as many processes of
    this step's pod; in a fan-out, `parts` are the locations of prepare_part_component's workers (dsl.Collected of
    their outputs), whose shards and partial statistics are merged into `dataset` (one worker's part is "": this step
    then prepares the whole dataset itself).
    """
    options = dict(locals())  # every parameter, as the stage's options
    from components.common.cli import component_errors
    from components.prepare_data.kfp_run import EXPECTED_ERRORS, run_prepare_data

    with component_errors("prepare_data", EXPECTED_ERRORS):
        run_prepare_data(options.pop("dataset"), options.pop("statistics"), **options)


@dsl.component(base_image=image("prepare_data"), install_kfp_package=False)
def prepare_worker_indices_component(prepare_workers: int) -> list:
    """[0, 1, ..., prepare_workers - 1]: the items of the ParallelFor of prepare workers."""
    return list(range(max(1, prepare_workers)))


@dsl.component(base_image=image("prepare_data"), install_kfp_package=False)
def prepare_part_component(
    part: dsl.Output[dsl.Dataset],
    index: int,
    prepare_workers: int = 1,
    source: str = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    source_sha256: str = "",
    validation_fraction: float = -1.0,
    leakage: str = "keep",
    examples_per_shard: int = 5000,
    compression: str = "NONE",
    resize: str = "",
    seed: int = 42,
    synthetic_train_per_class: int = 200,
    synthetic_eval_per_class: int = 50,
    max_source_megabytes: int = 1024,
    source_fingerprint: str = "",
) -> str:
    """Worker `index` of `prepare_workers` (a pod of the ParallelFor): its share of the shards and their partial
    statistics into `part`; returns where they are, for prepare_data_component's `parts`. With one worker it does
    nothing and returns "" (the prepare step then prepares the dataset itself). The options are the prepare step's;
    source_fingerprint, as the prepare step's, only keys the cache on the source's content."""
    options = dict(locals())  # every parameter, as the stage's options
    from components.common.cli import component_errors
    from components.prepare_data.kfp_run import EXPECTED_ERRORS, run_prepare_part

    with component_errors("prepare_data", EXPECTED_ERRORS):
        return run_prepare_part(options.pop("part"), **options)


@dsl.component(base_image=image("prepare_data"), install_kfp_package=False)
def source_fingerprint_component(source: str, launcher: str = "", promotion_root: str = "") -> str:
    """A fingerprint of the source's content (cheap: metadata or a hash), for cache keys. The run's first step: in
    a pod it first asks the Kubernetes API whether the run's service account holds what the run will need (the
    training job kind of `launcher`, Leases where a store cannot compare-and-swap) and refuses the run if not."""
    from components.common.cli import component_errors
    from components.prepare_data.fingerprint import source_fingerprint
    from components.prepare_data.kfp_run import EXPECTED_ERRORS
    from components.train.launcher import check_access

    with component_errors("prepare_data", EXPECTED_ERRORS):
        check_access(launcher, [source, promotion_root])
        return source_fingerprint(source)
