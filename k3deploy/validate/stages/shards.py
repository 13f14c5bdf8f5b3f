"""Stage `shards`: on every node at once, the checkpoint's structure (headers), its sha256 digests against the
manifest, and the digests across nodes."""
from __future__ import annotations

import json
from typing import Any

from k3deploy.catalog.specs import ModelSpec
from k3deploy.probes import shards as probe
from k3deploy.validate import compare
from k3deploy.validate.stage import ProgressEvent, StageResult, ValidateContext
from k3deploy.verdicts.model import NodeRow, Status

# Catalog architecture field -> its dotted path in config.json (text fields live under text_config).
CONFIG_PATHS = {"model_type": "model_type", "text_model_type": "text_config.model_type",
                "kda_layers": "text_config.linear_attn_config.kda_layers",
                "full_attn_layers": "text_config.linear_attn_config.full_attn_layers",
                "kda_num_heads": "text_config.linear_attn_config.num_heads",
                "kda_head_dim": "text_config.linear_attn_config.head_dim",
                "short_conv_kernel_size": "text_config.linear_attn_config.short_conv_kernel_size"}
# The expert format -> the quant description's model_quant_type its checkpoint carries (msModelSlim's W4A8,
# seed 004's Eco-Tech/Kimi-K3-w4a8 for vLLM-Ascend's --quantization ascend).
QUANT_TYPES = {"w4a8": "W4A8_DYNAMIC"}
STRUCTURE_BUDGET_S = 300.0


def config_expectations(model: ModelSpec) -> dict[str, Any]:
    """{dotted config.json key: value} the catalog entry implies (its config_keys override K3's layout)."""
    keys = {**CONFIG_PATHS, **model.architecture.config_keys}
    out = {}
    fields = model.architecture.config_fields()
    if model.architecture.head_dim is not None:  # GQA models: config.json's head_dim
        fields["head_dim"] = model.architecture.head_dim
    for field, value in fields.items():
        key = keys.get(field, f"text_config.{field}")
        if key is not None:  # a field the model's config.json does not carry (a catalog entry says so)
            out[key] = list(value) if isinstance(value, tuple) else value
    if model.weights.expert_format == "mxfp4":
        out["quantization_config.format"] = "mxfp4-pack-quantized"
    return out


class ShardsStage:
    """Structure, content and cross-node agreement of the checkpoint on every node."""

    name = "shards"
    needs_deployment = False

    def run(self, ctx: ValidateContext) -> StageResult:
        """Run the probe everywhere and turn its answers into node rows."""
        spec = {"path": ctx.topology.model.path, "expect": config_expectations(ctx.model), "hash": True,
                "quant_type": QUANT_TYPES.get(ctx.model.weights.expert_format),
                "files": ctx.manifest.expected() if ctx.manifest is not None else None, "progress_s": 1.0}
        timeout_s = ctx.topology.validate_.shards_timeout_s or (
            STRUCTURE_BUDGET_S + ctx.model.weights.total_bytes / probe.MIN_HASH_BYTES_PER_S)

        def on_line(rank: int, line: str) -> None:
            try:
                tick = json.loads(line)
            except ValueError:
                return
            if isinstance(tick, dict) and tick.get("type") == "progress":
                ctx.progress(ProgressEvent(self.name, rank, ctx.host(rank), int(tick["done"]), int(tick["total"]),
                                           float(tick["elapsed_s"])))

        outcomes = ctx.run_probe(probe, [json.dumps(spec)], timeout_s=timeout_s, on_line=on_line)
        return self._result(ctx, outcomes)

    def _result(self, ctx: ValidateContext, outcomes: Any) -> StageResult:
        problems: dict[int, list[str]] = {}
        errors: dict[int, str] = {}
        digests: list[compare.NodeDigests] = []
        answers: dict[int, dict[str, Any]] = {}
        for node in ctx.nodes:
            outcome = outcomes.get(node.rank)
            value = outcome.value if outcome is not None and outcome.ok else None
            if not isinstance(value, dict) or value.get("type") != "result":
                errors[node.rank] = str(outcome.error) if outcome is not None and outcome.error else \
                    f"the probe gave no result ({str(value)[:200]})"
                continue
            answers[node.rank] = value
            found = [p["message"] for p in value.get("problems", [])]
            if value.get("fatal"):
                found.insert(0, value["fatal"])
            bad = frozenset(p["file"] for p in value.get("problems", []))
            files = {n: (int(d[0]), str(d[1])) for n, d in value.get("files", {}).items()}
            node_digests = compare.NodeDigests(node.rank, files, value.get("revision"), bad)
            if ctx.manifest is not None and not value.get("fatal"):
                found += compare.against_manifest(node_digests, ctx.manifest)
            problems[node.rank] = found
            if not value.get("fatal"):
                digests.append(node_digests)
        for rank, lines in compare.across_nodes(digests).items():
            problems[rank] += [] if ctx.manifest is not None and problems[rank] else lines
        rows = [self._row(node.rank, node.host, problems.get(node.rank, []), errors.get(node.rank),
                          answers.get(node.rank)) for node in ctx.nodes]
        return _summary(self.name, rows, ctx)

    @staticmethod
    def _row(rank: int, host: str, found: list[str], error: str | None, answer: dict[str, Any] | None) -> NodeRow:
        if error is not None:
            return NodeRow(rank=rank, host=host, status="error", detail=error, problems=[error])
        assert answer is not None
        if found:
            more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
            return NodeRow(rank=rank, host=host, status="fail", detail=found[0] + more, problems=found)
        shards = sum(1 for n in answer.get("files", {}) if n.endswith(".safetensors"))
        rate = answer["hashed_bytes"] / answer["hash_s"] / 1e9 if answer.get("hash_s") else 0.0
        detail = (f"{shards} shards, {len(answer.get('files', {}))} files, {answer['hashed_bytes']:,} bytes; "
                  f"headers {answer['structure_s']:.2f} s, sha256 {answer['hash_s']:.1f} s ({rate:.2f} GB/s)")
        return NodeRow(rank=rank, host=host, status="pass", detail=detail)


def _summary(name: str, rows: list[NodeRow], ctx: ValidateContext) -> StageResult:
    failed = [r for r in rows if r.status == "fail"]
    broken = [r for r in rows if r.status == "error"]
    status: Status = "fail" if failed else "error" if broken else "pass"
    against = f"manifest revision {ctx.manifest.revision}" if ctx.manifest is not None else "each other (no manifest)"
    if status == "pass":
        detail = f"{len(rows)} node{'s' * (len(rows) > 1)}: structure sound, digests equal to {against}"
        evidence = f"{ctx.topology.model.path}: " + rows[0].detail if rows else ""
    else:
        bad = failed or broken
        detail = "; ".join(f"node {r.rank} ({r.host}): {r.detail}" for r in bad[:3])
        if len(bad) > 3:
            detail += f"; and {len(bad) - 3} more nodes"
        evidence = "\n".join(f"node {r.rank} ({r.host}): {p}" for r in bad for p in r.problems)
    return StageResult(name=name, status=status, detail=detail, nodes=rows,
                       evidence=evidence)
