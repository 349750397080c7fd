"""The cifar10-predict pipeline: the promoted model scores a prefix of new images (batch prediction, on a schedule).

python -m pipeline.pipeline predict compile                   # pipeline/predict.yaml
python -m pipeline.pipeline predict run --host $KFP_HOST --model s3://.../models --images s3://.../incoming/
python -m pipeline.pipeline predict schedule --host $KFP_HOST --cron "0 0 4 * * *" --model ... --images ...

Locally, `make predict` runs the same stage (components/predict/, docs/predict.md).
"""

from kfp import dsl

from components.predict.component import predict_component
from components.train.launch_config import LaunchConfig
from pipeline.training_pipeline import with_pod_settings

PIPELINE_NAME = "cifar10-predict"


@dsl.pipeline(name=PIPELINE_NAME, description="Score new images with the promoted CIFAR-10 model.")
def predict_pipeline(
    model: str,
    images: str,
    split: str = "eval",
    top_k: int = 3,
    batch_size: int = 256,
    resize: str = "",
    object_store_secret: str = LaunchConfig().object_store_secret,
    image_pull_secret: str = "",
):
    """Score `images` with the model `model` names.

    Args:
        model: A promotion root (its current version, so a schedule always uses the promoted model), a version
            folder, or a SavedModel folder.
        images: A folder or gs:// / s3:// prefix of JPEG and PNG images, or a prepared dataset (its `split`).
        split: With a prepared dataset: the split to score.
        top_k: Classes listed per image.
        batch_size: Images per model call.
        resize: HEIGHTxWIDTH (or N), the model's input size: resize every image to it ("": an image of another size is
            skipped and counted).
        object_store_secret: The secret with the object store's keys (accesskey, secretkey); KFP's by default.
        image_pull_secret: The secret for pulling the image from a private registry ("": none).
    """
    task = predict_component(model=model, images=images, split=split, top_k=top_k, batch_size=batch_size, resize=resize)
    task.set_caching_options(False)  # new images arrive under the same prefix; the promoted model changes
    task.set_cpu_request("2").set_memory_request("4Gi")
    with_pod_settings(task, object_store_secret, image_pull_secret)
