"""The direct baseline of tests/bench/multimodal.py: one model run by transformers alone, no Gantry.

Run as a script by the same python a model host of the adapter runs in (`.venv` for Whisper,
`.venv-vision` for the image adapters), so it imports nothing of Gantry:

    python tests/bench/multimodal_direct.py ADAPTER MODEL_DIR INPUT_FILE THREADS [LABEL ...]

It imports torch and transformers, pins torch to THREADS threads, loads the model the way the
adapter does (`from_pretrained`, `local_files_only=True`, no remote code, eval mode, CPU), runs one
first request on INPUT_FILE's bytes and prints one JSON line: the import, load and first-request
seconds and the memory (VmRSS and VmHWM from /proc/self/status, the readings a model host takes of
itself; `ru_maxrss` where /proc cannot be read). Then each line on stdin names a request kind
(`transcribe`, `recognize_text`, `embed_image`, `classify_image`) and is answered by one JSON line
with its milliseconds and its output (so the bench can check that both sides did the same work);
`memory` is answered by the memory readings; EOF ends it.

A request starts from the encoded bytes (WAV or PNG), as the host's does: decoding is part of it.
"""

from __future__ import annotations

import io
import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STARTED = time.monotonic()
# A loader yields twice: once its imports are done, then the requests of the loaded model.
Loader = Iterator["dict[str, Callable[[], Any]] | None"]


def memory() -> dict[str, int]:
    """VmRSS and VmHWM in bytes; from getrusage when /proc/self/status cannot be read."""
    readings: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                readings[key] = int(rest.split()[0]) * 1024
    except OSError:
        readings["VmHWM"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": readings.get("VmRSS", 0), "peak_rss_bytes": readings["VmHWM"]}


def whisper(directory: str, data: bytes, _labels: list[str]) -> Loader:
    import wave

    import numpy as np
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    yield None  # imported
    processor = WhisperProcessor.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    )
    model = WhisperForConditionalGeneration.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    ).eval()
    window = processor.feature_extractor.n_samples

    def transcribe() -> str:
        with wave.open(io.BytesIO(data)) as clip:
            rate = clip.getframerate()
            raw = clip.readframes(clip.getnframes())
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        texts = []
        for start in range(0, len(samples), window):  # 30 s windows, as the adapter cuts them
            features = processor.feature_extractor(
                samples[start : start + window], sampling_rate=rate, return_tensors="pt"
            ).input_features
            with torch.inference_mode():
                ids = model.generate(
                    features, language="en", task="transcribe", do_sample=False, num_beams=1
                )
            texts.append(processor.tokenizer.decode(ids[0].tolist(), skip_special_tokens=True))
        return " ".join(text.strip() for text in texts if text.strip())

    yield {"transcribe": transcribe}


def _image(data: bytes) -> Any:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def trocr(directory: str, data: bytes, _labels: list[str]) -> Loader:
    import torch
    from transformers import TrOCRProcessor, VisionEncoderDecoderModel

    yield None  # imported
    processor = TrOCRProcessor.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    )
    model = VisionEncoderDecoderModel.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    ).eval()

    def recognize_text() -> list[str]:
        pixels = processor(images=[_image(data)], return_tensors="pt").pixel_values
        with torch.inference_mode():
            ids = model.generate(pixels, num_beams=1, do_sample=False)
        return list(processor.tokenizer.batch_decode(ids, skip_special_tokens=True))

    yield {"recognize_text": recognize_text}


def siglip2(directory: str, data: bytes, labels: list[str]) -> Loader:
    import torch
    from transformers import AutoModel, AutoProcessor

    yield None  # imported
    processor = AutoProcessor.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    )
    model = AutoModel.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False
    ).eval()
    # The artifact's image processor itself: the processor's call would apply its class defaults
    # (256 patches of 16 pixels) over what the artifact says.
    image_processor = processor.image_processor
    positions = model.config.text_config.max_position_embeddings

    def embed_image() -> list[float]:
        pixels = image_processor([_image(data)], return_tensors="pt")
        with torch.inference_mode():
            vector = model.get_image_features(**pixels).pooler_output
        return [float(value) for value in vector[0]]

    def classify_image() -> list[float]:
        # SigLIP's text tower was trained on texts padded to all its positions.
        text = processor.tokenizer(
            labels, padding="max_length", max_length=positions, truncation=True, return_tensors="pt"
        )
        pixels = image_processor([_image(data)], return_tensors="pt")
        with torch.inference_mode():
            scores = torch.sigmoid(model(**text, **pixels).logits_per_image)
        return [float(value) for value in scores[0]]

    yield {"embed_image": embed_image, "classify_image": classify_image}


LOADERS = {
    "transformers_whisper": whisper,
    "transformers_trocr": trocr,
    "transformers_siglip2": siglip2,
}


def main(argv: list[str]) -> int:
    adapter, directory, input_file, threads, *labels = argv
    data = Path(input_file).read_bytes()
    import torch
    import transformers

    torch.set_num_threads(int(threads))
    loader = LOADERS[adapter](directory, data, labels)
    next(loader)
    imported = time.monotonic()
    requests = next(loader)
    assert requests is not None
    loaded = time.monotonic()
    first = next(iter(requests.values()))
    first()
    ready = time.monotonic()
    print(
        json.dumps(
            {
                "import_s": imported - STARTED,
                "load_s": loaded - imported,
                "first_s": ready - loaded,
                "threads": torch.get_num_threads(),
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                **memory(),
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        kind = line.strip()
        if kind == "memory":
            print(json.dumps(memory()), flush=True)
            continue
        started = time.perf_counter()
        output = requests[kind]()
        elapsed_ms = (time.perf_counter() - started) * 1000
        print(json.dumps({"ms": elapsed_ms, "output": output}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
