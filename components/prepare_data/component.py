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
):
    """Convert the source to sharded, checksummed TFRecords in the `dataset` artifact.

    validation_fraction < 0 keeps the source's own hold-out (data batch 5); source_sha256 "" checks
    only the official archive's known digest; resize "HxW" resizes every image ("": the images' own size); leakage
    "drop_from_train" or "drop_from_eval" removes test images' near-duplicates from training or the test images;
    max_source_megabytes bounds what the source may unpack to (the step's memory must go with it).
    `statistics` shows the dataset's statistics.json (class balance, channels, sizes, duplicates and leakage).
    source_fingerprint is only for caching: pass the output of source_fingerprint_component so that a cached
    result is reused only for unchanged source content.
    """
    from components.common.cli import component_errors
    from components.prepare_data.kfp_run import EXPECTED_ERRORS, run_prepare_data

    with component_errors("prepare_data", EXPECTED_ERRORS):
        run_prepare_data(
            dataset,
            statistics,
            source=source,
            leakage=leakage,
            source_sha256=source_sha256,
            validation_fraction=validation_fraction,
            examples_per_shard=examples_per_shard,
            compression=compression,
            resize=resize,
            seed=seed,
            synthetic_train_per_class=synthetic_train_per_class,
            synthetic_eval_per_class=synthetic_eval_per_class,
            max_source_megabytes=max_source_megabytes,
            source_fingerprint=source_fingerprint,
        )


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
