"""The request a client sends the served model (KServe's v1 protocol, TensorFlow Serving's REST API) and the answer
it gets back, computed here from the SavedModel without a server: to try a promoted model before deploying it, and
to show in the docs what a server answers.

    python -m components.evaluate.serving_request IMAGE.png [IMAGE.jpg ...] > request.json
    python -m components.evaluate.serving_request --answer-from PROMOTION_ROOT IMAGE.png      (request and answer)

The request names the encoded-image signature and sends each image base64-encoded under the input `image_bytes`:
`{"signature_name": "serving_image_bytes", "instances": [{"image_bytes": {"b64": "..."}}]}`. TF Serving answers in
its row format, one object per instance: `{"predictions": [{"classes": 3, "class_names": "cat",
"probabilities": [...]}]}`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

SIGNATURE = "serving_image_bytes"
INPUT = "image_bytes"


def request_body(images: list[bytes]) -> dict:
    return {
        "signature_name": SIGNATURE,
        "instances": [{INPUT: {"b64": base64.b64encode(image).decode()}} for image in images],
    }


def served_version(root: str | Path) -> Path:
    """What TensorFlow Serving loads from a model base path: its numerically highest folder with a SavedModel."""
    root = Path(root)
    if (root / "saved_model.pb").exists():
        return root
    versions = [path for path in root.iterdir() if path.name.isdigit() and (path / "saved_model.pb").exists()]
    if not versions:
        raise ValueError(f"{root}: no numbered version folder with a saved_model.pb (nothing promoted yet?)")
    return max(versions, key=lambda path: int(path.name))


def answer(saved_model: str | Path, body: dict) -> dict:
    """The REST answer to `body` from the SavedModel at `saved_model` (a version folder or a promotion root)."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(served_version(saved_model))).signatures[body.get("signature_name", SIGNATURE)]
    encoded = [base64.b64decode(instance[INPUT]["b64"]) for instance in body["instances"]]
    outputs = signature(**{INPUT: tf.constant(encoded)})
    rows = []
    for index in range(len(encoded)):
        row = {}
        for name, value in sorted(outputs.items()):
            item = value.numpy()[index]
            row[name] = item.decode() if isinstance(item, bytes) else item.tolist()
        rows.append(row)
    return {"predictions": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.evaluate.serving_request", description=__doc__.split("\n")[0]
    )
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    parser.add_argument("--answer-from", help="a promotion root or version folder: also print its answer")
    arguments = parser.parse_args(argv)
    body = request_body([path.read_bytes() for path in arguments.images])
    if arguments.answer_from is None:
        json.dump(body, sys.stdout)
    else:
        json.dump({"request": body, "answer": answer(arguments.answer_from, body)}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
