"""Sentence-transformers layouts: an embedding model, or a cross-encoder that reranks.

An embedding model is a `modules.json` pipeline (Transformer, Pooling, ...), optionally marked
`model_type: SentenceTransformer`. A cross-encoder is marked `model_type: CrossEncoder` (how
sentence-transformers >= 4 saves one), or is a plain transformers `*ForSequenceClassification`
config with exactly one label (how older versions saved one, and how most rerankers ship).
"""

from __future__ import annotations

from typing import Any

from gantry.worker.inspection import transformers
from gantry.worker.inspection.artifact_files import ArtifactFiles, Draft, keep, text

MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
BERT_CONFIG = "sentence_bert_config.json"
LAYOUT_FILES = (MODULES, ST_CONFIG, BERT_CONFIG)

# Pooling flags up to sentence-transformers 5, by the `pooling_mode` name later versions write.
_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def recognises(files: ArtifactFiles) -> bool:
    if any(files.has(path) for path in LAYOUT_FILES):
        return True
    config = files.json_object(transformers.CONFIG, [])
    return transformers.is_cross_encoder_config(config)


def _module_types(modules: object) -> list[tuple[str, str]]:
    """(short class name, path) of each module in modules.json order."""
    if not isinstance(modules, list):
        return []
    found: list[tuple[str, str]] = []
    for module in modules:
        if not isinstance(module, dict):
            continue
        module_type, path = module.get("type"), module.get("path")
        if isinstance(module_type, str):
            found.append((module_type.rsplit(".", 1)[-1], path if isinstance(path, str) else ""))
    return found


def _under(directory: str, name: str) -> str:
    return f"{directory.strip('/')}/{name}" if directory.strip("/") else name


def inspect(files: ArtifactFiles) -> Draft:
    draft = Draft(inspector="sentence_transformers", key_path=MODULES, modalities=["text"])
    findings = draft.findings
    st_config = files.json_object(ST_CONFIG, findings)
    modules, problem = files.json(MODULES)
    if problem is not None:
        findings.append(problem)
    module_types = _module_types(modules)
    names = [name for name, _ in module_types]
    transformer_dir = next((path for name, path in module_types if name == "Transformer"), "")
    config_path = _under(transformer_dir, transformers.CONFIG)
    config = files.json_object(config_path, findings)
    st_model_type = st_config.get("model_type")

    draft.model_type = str(config.get("model_type") or st_model_type or "")
    draft.details.update(transformers.model_details(config))
    if module_types:
        draft.details["modules"] = ",".join(names)
    if isinstance(st_model_type, str):
        draft.details["sentence_transformers_model_type"] = st_model_type
    versions = st_config.get("__version__")
    if isinstance(versions, dict) and isinstance(versions.get("sentence_transformers"), str):
        draft.details["saved_with_sentence_transformers"] = versions["sentence_transformers"]
    keep(draft.details, files.json_object(BERT_CONFIG, findings), "max_seq_length")

    cross_encoder = st_model_type == "CrossEncoder" or (
        st_model_type is None
        and "Pooling" not in names
        and transformers.is_cross_encoder_config(config)
    )
    if cross_encoder:
        draft.key_path = ST_CONFIG if st_model_type == "CrossEncoder" else config_path
        _add_cross_encoder(draft, st_config, config, config_path=config_path)
        return draft
    if st_model_type not in (None, "SentenceTransformer"):
        draft.key_path = ST_CONFIG
        draft.task = f"{str(st_model_type).lower()}-embedding"
        return draft  # SparseEncoder and later kinds: assessed, no adapter runs them here
    _add_embedding(files, draft, module_types)
    return draft


def _add_cross_encoder(
    draft: Draft, st_config: dict[str, Any], config: dict[str, Any], *, config_path: str
) -> None:
    """A cross-encoder's task and details, and a refusal unless it gives one score per pair."""
    draft.task = "reranking"
    draft.details["num_labels"] = str(transformers.num_labels(config))
    keep(draft.details, st_config, "activation_fn")
    # Which adapter runs it is the runtime adapters' decision (their inspect_support).
    if transformers.num_labels(config) != 1:
        draft.refuse(
            f"a cross-encoder with num_labels={transformers.num_labels(config)}: "
            "reranking needs exactly one score per pair",
            config_path,
        )


def _add_embedding(files: ArtifactFiles, draft: Draft, module_types: list[tuple[str, str]]) -> None:
    """An embedding model's task and details: normalisation, pooling and its width."""
    draft.key_path = (
        MODULES if files.has(MODULES) else next(path for path in LAYOUT_FILES if files.has(path))
    )
    draft.task = "embedding"
    draft.details["normalize"] = text("Normalize" in [name for name, _ in module_types])
    pooling_dir = next((path for name, path in module_types if name == "Pooling"), None)
    if pooling_dir is not None:
        pooling = files.json_object(_under(pooling_dir, "config.json"), draft.findings)
        # "word_embedding_dimension" up to sentence-transformers 5, "embedding_dimension" after.
        for key in ("word_embedding_dimension", "embedding_dimension"):
            if key in pooling:
                draft.details["embedding_dimension"] = text(pooling[key])
        modes = [mode for flag, mode in _POOLING_FLAGS.items() if pooling.get(flag) is True]
        if isinstance(pooling.get("pooling_mode"), str):
            modes = [pooling["pooling_mode"]]
        if modes:
            draft.details["pooling"] = ",".join(modes)
