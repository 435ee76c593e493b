"""The evidence pipeline's commands: assess, profile, probe (start/show/list/cancel), approve,
candidates, bind. Each walks one gate and prints what it recorded (`--output json`: the record as
JSON); a refused gate exits 1."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from gantry.cli import pipeline
from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, AddCommand, CommandContext, paged
from gantry.cli.errors import CliError
from gantry.cli.jobs_commands import resolve_node_id  # one rule for NODE arguments
from gantry.cli.output import (
    add_output_argument,
    message_dict,
    print_json,
    print_records,
    wants_json,
)
from gantry.cli.tables import enum_label, format_bytes
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

DEFAULT_WAIT_S = 600.0
UINT32_MAX = 2**32 - 1  # AdapterSettings.image_size, sampling_rate_hz and max_new_tokens


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print(lines: list[str]) -> None:
    print("\n".join(lines))


def channel_values(text: str) -> list[float]:
    """`--image-mean` / `--image-std`: comma-separated numbers, one per channel ("0.5,0.5,0.5").
    Only their form is checked here; the control plane checks them against the artifact."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not comma-separated numbers, one per channel (such as 0.5,0.5,0.5)"
        ) from None
    if not all(math.isfinite(value) for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every channel's value must be finite")
    return values


def positive_whole(text: str) -> int:
    """`--image-size` / `--sampling-rate`: a whole number from 1 (leaving the flag out is 0:
    inspection's value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= UINT32_MAX:
        raise argparse.ArgumentTypeError(f"must be 1..{UINT32_MAX}, not {value}")
    return value


# ---- arguments ----------------------------------------------------------------------------------


def add_wait_options(parser: CommandSpec) -> None:
    """--no-wait and --wait-timeout: for the gates that run a job on a node (assess, probe)."""
    parser.add_argument(
        "--no-wait", action="store_true", help="start it and return; do not wait for its result"
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait (default {DEFAULT_WAIT_S:g})",
    )


def add_assess_command(command: AddCommand) -> None:
    assess_parser = command("assess", assess, "inspect an artifact set statically on a node")
    assess_parser.add_argument("artifact_set_id", metavar="ARTIFACT_SET_ID")
    assess_parser.add_argument(
        "--node", metavar="NODE", help="a node id or name (default: any connected node)"
    )
    assess_parser.add_argument(
        "--environment",
        metavar="ENV_ID",
        help="the worker's runtime environment to inspect in, e.g. vision (default: its default)",
    )
    add_wait_options(assess_parser)
    add_output_argument(assess_parser)


def add_profile_command(command: AddCommand) -> None:
    profile_parser = command("profile", profile, "create a runtime profile from an assessment")
    profile_parser.add_argument("assessment_id", metavar="ASSESSMENT_ID")
    profile_parser.add_argument("--name", required=True)
    profile_parser.add_argument(
        "--adapter",
        default="sentence_transformers",
        help="sentence_transformers (embeddings), sentence_transformers_cross_encoder "
        "(reranking), transformers_whisper (speech recognition), transformers_trocr (text "
        "recognition in images), transformers_siglip2 (image embeddings and classification), "
        "transformers_causal_lm (text generation in a model host) or llama_cpp_server (a GGUF "
        "served by llama.cpp's server, which the worker starts; vllm_server where vLLM is "
        "installed)",
    )
    profile_parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 (default cpu)")
    profile_parser.add_argument(
        "--language", default="", help="transformers_whisper: a code such as en (default: detect)"
    )
    profile_parser.add_argument(
        "--task", default="", help="transformers_whisper: transcribe (default) or translate"
    )
    _add_preprocessing_arguments(profile_parser)
    profile_parser.add_argument("--normalize", action="store_true", help="L2-normalise embeddings")
    profile_parser.add_argument("--max-batch-size", type=int, default=0, metavar="N")
    profile_parser.add_argument("--max-input-length", type=int, default=0, metavar="TOKENS")
    profile_parser.add_argument("--ram-estimate", type=int, default=0, metavar="BYTES")
    profile_parser.add_argument("--vram-estimate", type=int, default=0, metavar="BYTES")
    profile_parser.add_argument(
        "--allow-pickle-weights",
        action="store_true",
        help="let this profile load pickle-based weights (recorded in the audit log)",
    )
    add_output_argument(profile_parser)


def _add_preprocessing_arguments(parser: CommandSpec) -> None:
    # Inspection fills in what is left unset; a value given must agree with the artifact's own
    # processor (the control plane refuses one that does not).
    parser.add_argument(
        "--image-size",
        type=positive_whole,
        default=0,
        metavar="N",
        help="image adapters: the square side the processor hands the model (default: inspected)",
    )
    parser.add_argument(
        "--image-mean",
        type=channel_values,
        default=[],
        metavar="A,B,C",
        help="image adapters: per-channel normalisation mean (default: inspected)",
    )
    parser.add_argument(
        "--image-std",
        type=channel_values,
        default=[],
        metavar="A,B,C",
        help="image adapters: per-channel normalisation std (default: inspected)",
    )
    parser.add_argument(
        "--sampling-rate",
        type=positive_whole,
        default=0,
        metavar="HZ",
        help="transformers_whisper: the feature extractor's sampling rate (default: inspected)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_whole,
        default=0,
        metavar="N",
        help="generation adapters: the most new tokens one call may ask (default: the "
        "adapter's, 1024)",
    )


def add_probe_command(command: AddCommand) -> None:
    probe_parser = command(
        "probe",
        probe,
        "probe a profile (gantry probe PROFILE_ID), or: probe show|cancel PROBE_ID, probe list",
    )
    probe_parser.add_argument("words", nargs="+", metavar="PROFILE_ID | show PROBE_ID | list")
    probe_parser.add_argument(
        "--node", metavar="NODE", help="a node id or name (default: the assessing node)"
    )
    add_wait_options(probe_parser)
    add_output_argument(probe_parser)


def add_candidates_command(command: AddCommand) -> None:
    add_output_argument(command("candidates", candidates, "list deployment candidates"))


def add_approve_command(command: AddCommand) -> None:
    approve_parser = command("approve", approve, "approve a LAB_READY candidate for production")
    approve_parser.add_argument("candidate_id", metavar="CANDIDATE_ID")
    approve_parser.add_argument("--reason", required=True, help="why it may serve (recorded)")
    add_output_argument(approve_parser)


def add_bind_command(command: AddCommand) -> None:
    bind_parser = command("bind", bind, "bind a capability to exactly one deployment")
    bind_parser.add_argument("capability", metavar="CAPABILITY")
    bind_parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    add_output_argument(bind_parser)


# ---- commands -----------------------------------------------------------------------------------


def assess(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        assessment = pipeline.assess(
            stub,
            metadata,
            artifact_set_id=args.artifact_set_id,
            node_id=resolve_node_id(stub, args.node, metadata) if args.node else "",
            environment_id=args.environment or "",
            say=_say,
            timeout_s=args.wait_timeout,
            wait=not args.no_wait,
        )
    if wants_json(args):
        print_json(assessment)
    else:
        _print(pipeline.describe_assessment(assessment))
    if args.no_wait or assessment.compatible:
        return 0
    return 1


def profile(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    request = control_plane_pb2.CreateRuntimeProfileRequest(
        assessment_id=args.assessment_id,
        name=args.name,
        adapter=common_pb2.AdapterSettings(
            adapter=args.adapter,
            device=args.device,
            normalize=args.normalize,
            max_batch_size=args.max_batch_size,
            max_input_length=args.max_input_length,
            allow_pickle_weights=args.allow_pickle_weights,
            language=args.language,
            task=args.task,
            image_size=args.image_size,
            image_mean=args.image_mean,
            image_std=args.image_std,
            sampling_rate_hz=args.sampling_rate,
            max_new_tokens=args.max_new_tokens,
        ),
        ram_estimate_bytes=args.ram_estimate,
        vram_estimate_bytes=args.vram_estimate,
    )
    with context.open_channel() as channel:
        created = control_plane_pb2_grpc.ControlPlaneStub(channel).CreateRuntimeProfile(
            request, metadata=metadata, timeout=DEFAULT_TIMEOUT_S
        )
    if wants_json(args):
        print_json(created)
    else:
        _print(describe_profile(created))
    return 0


def describe_profile(profile: control_plane_pb2.RuntimeProfile) -> list[str]:
    adapter = profile.adapter
    return [
        f"profile      {profile.profile_id}",
        f"name         {profile.name}",
        f"assessment   {profile.assessment_id}",
        f"artifact set {profile.artifact_set_id}",
        f"environment  {profile.environment_id or 'default'}",
        f"adapter      {adapter.adapter} on {adapter.device or 'cpu'}"
        f" (normalize={str(adapter.normalize).lower()},"
        f" max_batch_size={adapter.max_batch_size or 'default'},"
        f" max_input_length={adapter.max_input_length or 'default'},"
        f" allow_pickle_weights={str(adapter.allow_pickle_weights).lower()})",
        *_bound_settings_lines(adapter),
        f"envelope     ram {format_bytes(profile.ram_envelope_bytes)}"
        f" (estimate {format_bytes(profile.ram_estimate_bytes)}),"
        f" vram {format_bytes(profile.vram_envelope_bytes)}"
        f" (estimate {format_bytes(profile.vram_estimate_bytes)})",
    ]


def _bound_settings_lines(adapter: common_pb2.AdapterSettings) -> list[str]:
    """What the profile bound of its model's preprocessing (inspection's, unless the operator's
    flags said it), and a causal LM's max new tokens when set; no line for a profile that binds
    none (the text adapters)."""
    bound = []
    if adapter.image_size:
        bound.append(f"image_size={adapter.image_size}")
    for name in ("image_mean", "image_std"):
        values = list(getattr(adapter, name))
        if values:
            bound.append(f"{name}={','.join(f'{value:g}' for value in values)}")
    if adapter.sampling_rate_hz:
        bound.append(f"sampling_rate={adapter.sampling_rate_hz} Hz")
    lines = [f"preprocess   {' '.join(bound)}"] if bound else []
    if adapter.max_new_tokens:
        lines.append(f"generation   max_new_tokens={adapter.max_new_tokens}")
    return lines


def probe_action(words: Sequence[str]) -> tuple[str, str]:
    """`gantry probe`'s words as an action (start, show, cancel, list) and its one id ("" for
    list); a CliError with the usage for any other shape. Pure."""
    rest = list(words)
    action = rest.pop(0) if rest and rest[0] in ("show", "cancel", "list") else "start"
    if action == "list":
        if rest:
            raise CliError("usage: gantry probe list")
        return action, ""
    if len(rest) != 1:
        raise CliError(
            "usage: gantry probe PROFILE_ID | gantry probe show PROBE_ID"
            " | gantry probe cancel PROBE_ID | gantry probe list"
        )
    return action, rest[0]


def probe(context: CommandContext, args: argparse.Namespace) -> int:
    """`gantry probe PROFILE_ID`, or `gantry probe show|cancel PROBE_ID`, or `gantry probe list`."""
    action, ident = probe_action(args.words)
    if action == "list":
        return _probe_list(context, args)
    found, candidate = _probe_and_candidate(context, args, action, ident)
    if wants_json(args):
        # The probe, and the candidate it produced when there is one.
        print_json(
            {
                "probe": message_dict(found),
                "candidate": message_dict(candidate) if candidate is not None else None,
            }
        )
    else:
        _print(pipeline.describe_probe(found, candidate))
    if action != "start" or args.no_wait:
        return 0
    lab_ready = candidate is not None and (
        candidate.status == control_plane_pb2.CANDIDATE_STATUS_LAB_READY
    )
    return 0 if lab_ready else 1


def _probe_and_candidate(
    context: CommandContext, args: argparse.Namespace, action: str, ident: str
) -> tuple[control_plane_pb2.RuntimeProbe, control_plane_pb2.DeploymentCandidate | None]:
    """The probe shown, cancelled or started (`ident`: its id, or the profile's for start), and
    the candidate it produced, if any."""
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        if action == "show":
            found = stub.GetProbe(
                control_plane_pb2.GetProbeRequest(probe_id=ident),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
        elif action == "cancel":
            found = stub.CancelProbe(
                control_plane_pb2.CancelProbeRequest(probe_id=ident),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
        else:
            found = pipeline.run_probe(
                stub,
                metadata,
                profile_id=ident,
                node_id=resolve_node_id(stub, args.node, metadata) if args.node else "",
                say=_say,
                timeout_s=args.wait_timeout,
                wait=not args.no_wait,
            )
        candidate = None
        if found.candidate_id:
            candidate = stub.GetDeploymentCandidate(
                control_plane_pb2.GetDeploymentCandidateRequest(candidate_id=found.candidate_id),
                metadata=metadata,
                timeout=DEFAULT_TIMEOUT_S,
            )
    return found, candidate


def _probe_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(
            paged(
                stub.ListProbes,
                control_plane_pb2.ListProbesRequest,
                lambda response: response.probes,
                metadata=metadata,
            )
        )
    print_records(
        args,
        found,
        ["ID", "PROFILE", "NODE", "STATE", "CANDIDATE"],
        lambda p: [
            p.probe_id,
            p.profile_id,
            p.node_id,
            pipeline.probe_state(p),
            p.candidate_id or "-",
        ],
    )
    return 0


def candidates(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(
            paged(
                stub.ListDeploymentCandidates,
                control_plane_pb2.ListDeploymentCandidatesRequest,
                lambda response: response.candidates,
                metadata=metadata,
            )
        )
    print_records(
        args,
        found,
        ["ID", "PROFILE", "STATUS", "PRODUCTION", "APPROVAL"],
        lambda c: [
            c.candidate_id,
            c.profile_id,
            pipeline.candidate_status(c),
            "yes" if c.production else "no",
            c.approval_id or "-",
        ],
    )
    return 0


def approve(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        approval = control_plane_pb2_grpc.ControlPlaneStub(channel).ApproveCandidate(
            control_plane_pb2.ApproveCandidateRequest(
                candidate_id=args.candidate_id, reason=args.reason
            ),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(approval)
        return 0
    print(f"approval     {approval.approval_id}")
    print(f"candidate    {approval.candidate_id}")
    print(f"profile      {approval.profile_id}")
    print(f"approved by  {approval.approved_by}")
    print(f"reason       {approval.reason}")
    return 0


def bind(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        binding = control_plane_pb2_grpc.ControlPlaneStub(channel).BindCapability(
            control_plane_pb2.BindCapabilityRequest(
                capability=args.capability, deployment_id=args.deployment_id
            ),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(binding)
    else:
        print(describe_binding(binding))
    return 0


def describe_binding(binding: control_plane_pb2.CapabilityBinding) -> str:
    serving = binding.deployment_id or "nothing yet"
    line = f"capability {binding.capability} -> {serving}"
    if binding.pending_deployment_id:
        line += f" (moves to {binding.pending_deployment_id} when it is READY)"
    return line


def deployment_state_label(state: int) -> str:
    return enum_label(control_plane_pb2.DeploymentState.Name(state), "DEPLOYMENT_STATE_")
