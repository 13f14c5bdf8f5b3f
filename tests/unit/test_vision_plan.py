"""K3's vision in the plan: the image tokens an image costs (the engine's processor arithmetic), the tower's weights
per GPU where each engine keeps them, images in --workload, the multimodal flags rendered, and a single-node
feature transport refused across nodes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.image_tokens import image_tokens
from k3deploy.errors import InputError
from k3deploy.planning.workload import parse_workload, with_images
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]


def k3deploy(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, 200 columns wide."""
    return subprocess.run([sys.executable, "-m", "k3deploy", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                        "COLUMNS": "200"})


def test_image_tokens_follow_the_processor_arithmetic_for_three_sizes() -> None:
    """vLLM's Kimi-K3 preprocessing (vllm/models/kimi_k3/common/mm_preprocess.py, navit_resize_image) with K3's
    media_proc_cfg (patch p = 14, merge 2, in_patch_limit 65536, patch_limit_on_one_side 512):
    scale = min(1, sqrt(65536 / ((w // 14) (h // 14))), 512 x 14 / w, 512 x 14 / h); w' = int(w x scale),
    h' = int(h x scale); each padded up to a multiple of 28 (2 x 14); tokens = (h'' / 28) x (w'' / 28).

    448 x 448: 32 x 32 = 1,024 patches, sqrt(65536 / 1024) = 8, so scale 1; 448 = 16 x 28, no padding:
    16 x 16 = 256 tokens.
    1000 x 700: 71 x 50 = 3,550 patches, scale 1; 1000 = 35 x 28 + 20, padded by 8 to 1008 = 36 x 28; 700 = 25 x 28:
    36 x 25 = 900 tokens.
    8000 x 6000: 571 x 428 = 244,388 patches, scale = sqrt(65536 / 244388) = 256 / 494.356 = 0.517845 (below 7168 /
    8000 = 0.896); w' = int(4142.76) = 4142 = 147 x 28 + 26, padded by 2 to 4144 = 148 x 28; h' = int(3107.07) =
    3107 = 110 x 28 + 27, padded by 1 to 3108 = 111 x 28: 148 x 111 = 16,428 tokens."""
    v = load_catalog().model("kimi-k3").vision
    assert v is not None
    assert image_tokens(v, 448, 448) == (448, 448, 448, 448, 0, 0, 256)
    assert image_tokens(v, 1000, 700) == (1000, 700, 1000, 700, 8, 0, 900)
    assert image_tokens(v, 8000, 6000) == (8000, 6000, 4142, 3107, 2, 1, 16428)


def test_a_workloads_images_grow_each_requests_context_by_their_tokens() -> None:
    cat = load_catalog()
    w = parse_workload("in=2048,out=512,concurrency=8,images=2,image_px=1000x700")
    grown = with_images(w, cat.model("kimi-k3"))
    # 900 pads each (above) and at most 16 marker tokens around them (the catalog's wrapper_tokens_max)
    assert (grown.text_tokens, grown.image_tokens, grown.input_tokens) == (2048, 916, 2048 + 2 * 916)
    assert with_images(grown, cat.model("kimi-k3")) == grown  # resolved once
    assert with_images(parse_workload("in=2048,out=512,concurrency=8"), cat.model("kimi-k3")).input_tokens == 2048


@pytest.mark.parametrize("text, said", [
    ("in=1,out=2,concurrency=1,images=2", "images=N and image_px=WxH go together"),
    ("in=1,out=2,concurrency=1,image_px=10x10", "images=N and image_px=WxH go together"),
    ("in=1,out=2,concurrency=1,images=1,image_px=10by10", "is not WIDTHxHEIGHT in pixels"),
    ("in=1,out=2,concurrency=1,images=2000,image_px=10x10", "images='2000': expected a whole number from 0"),
])
def test_a_malformed_image_workload_is_named(text: str, said: str) -> None:
    with pytest.raises(InputError, match=said):
        parse_workload(text)


def test_plan_shows_the_image_tokens_and_the_vision_tower() -> None:
    run = k3deploy("plan", "topologies/h100-4x8-sglang.yaml", "--workload",
                   "in=2048,out=512,concurrency=8,images=2,image_px=1000x700")
    assert run.returncode == 0, run.stderr
    assert "3,880 in = 2,048 text + 2 image(s) of 1000x700 px x 916 tokens each" in run.stdout
    assert "Predicted for 3,880 in / 512 out" in run.stdout
    assert "vision tower (MoonViT-V2, 401M BF16, 0.75 GiB): replicated, 0.75 GiB per GPU" in run.stdout
    doc = json.loads(k3deploy("plan", "topologies/h100-4x8-sglang.yaml", "--json").stdout)
    assert doc["vision"]["tower_bytes"] == 802_000_000 and doc["vision"]["placement"] == "replicated"


@pytest.mark.parametrize("tp, args, serving, placement, per_gpu", [
    (4, {}, {}, "sharded", 802_000_000 // 4),  # 12 heads divide over TP 4
    (8, {}, {}, "replicated", 802_000_000),  # 12 heads do not divide over TP 8: data parallel fallback
    (4, {"--mm-encoder-tp-mode": "data"}, {}, "replicated", 802_000_000),
    (8, {}, {"images_per_request": 0}, "skipped", 0),  # limit 0: vLLM does not build the tower
])
def test_vllm_keeps_the_tower_where_its_rules_say(tp: int, args: dict[str, str], serving: dict[str, int],
                                                   placement: str, per_gpu: int) -> None:
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, kind="vllm", tp=tp, ep=tp, **serving)
    doc["engine"]["args"] = args
    v = plan_of(doc).vision
    assert v is not None and (v.placement, v.per_gpu_bytes) == (placement, per_gpu)
    assert v.counted_bytes == -(-802_000_000 // tp) and v.extra_bytes == max(0, per_gpu - v.counted_bytes)


@pytest.mark.parametrize("kind, flag", [("vllm", "--limit-mm-per-prompt"), ("sglang", "--limit-mm-data-per-request")])
def test_images_per_request_renders_each_engines_limit(kind: str, flag: str) -> None:
    from k3deploy.engines.render import render_nodes

    doc = topology_dict(gpu="b300", per_node=8, nodes=1, kind=kind, tp=8, ep=8, images_per_request=3)
    argv = render_nodes(plan_of(doc).render_inputs())[0].argv
    assert argv[argv.index(flag) + 1] == '{"image": 3}'
    doc = topology_dict(gpu="b300", per_node=8, nodes=1, kind=kind, tp=8, ep=8)
    assert flag not in render_nodes(plan_of(doc).render_inputs())[0].argv


def test_cuda_ipc_across_nodes_exits_2_naming_the_line(tmp_path: Path) -> None:
    doc = topology_dict()
    doc["engine"]["args"] = {"--mm-feature-transport": "cuda_ipc"}
    path = tmp_path / "mm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "--mm-feature-transport" in text)
    run = k3deploy("plan", str(path))
    assert run.returncode == 2, run.stdout
    assert f"{path}:{line}" in run.stdout and "MM_CUDA_IPC_MULTINODE" in run.stdout
    assert "use --mm-feature-transport cpu on a multi-node deployment" in run.stdout


def test_a_workload_with_more_images_than_the_deployment_takes_is_refused(tmp_path: Path) -> None:
    doc = topology_dict(images_per_request=1)
    path = tmp_path / "one-image.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = k3deploy("plan", str(path), "--workload", "in=1024,out=256,concurrency=4,images=2,image_px=448x448")
    assert run.returncode == 2, run.stdout
    said = " ".join((run.stdout + run.stderr).split())
    assert "--workload images=2: serving.images_per_request is 1, so the engine refuses such requests" in said
    assert k3deploy("plan", str(path), "--workload", "in=1024,out=256,concurrency=4,images=1,image_px=448x448"
                    ).returncode == 0


def test_each_role_of_a_prefill_decode_plan_shows_where_it_keeps_the_tower() -> None:
    run = k3deploy("plan", "topologies/pd-h200-1p1d-vllm.yaml")
    assert run.returncode == 0, run.stdout
    said = " ".join(run.stdout.split())
    assert said.count("vision tower (MoonViT-V2, 401M BF16, 0.75 GiB): replicated, 0.75 GiB per GPU: 12 encoder "
                      "heads do not divide over TP 8") == 2, said


TOWER = 802_000_000  # 401,000,000 parameters x 2 bytes (BF16)
ONE_IMAGE = 16_817 * 7_168 * 2  # the largest image's embeddings: T tokens x K3's hidden size x BF16 = 241,088,512


@pytest.mark.parametrize("kind, tp, dp, args, serving, pool", [
    ("vllm", 4, 2, {}, {}, ONE_IMAGE),
    ("vllm", 8, 1, {}, {}, TOWER - TOWER // 8 + ONE_IMAGE),
    ("vllm", 16, 1, {}, {}, TOWER - TOWER // 16 + ONE_IMAGE),
    ("vllm", 32, 1, {}, {}, TOWER - TOWER // 32 + ONE_IMAGE),
    ("vllm", 4, 2, {"--mm-encoder-tp-mode": "data"}, {}, TOWER - TOWER // 4 + ONE_IMAGE),
    ("vllm", 8, 1, {"--skip-mm-profiling": True}, {}, TOWER - TOWER // 8),
    ("vllm", 4, 2, {"--max-num-batched-tokens": 65536}, {}, 3 * ONE_IMAGE),
    ("vllm", 8, 1, {}, {"images_per_request": 0}, 0),
    ("sglang", 8, 1, {}, {}, TOWER - TOWER // 8),
    ("sglang", 32, 1, {}, {}, TOWER - TOWER // 32),
    ("sglang", 16, 16, {}, {}, 0),
    ("sglang", 16, 8, {}, {}, TOWER // 2),
], ids=["vllm-tp4-sharded", "vllm-tp8", "vllm-tp16", "vllm-tp32", "vllm-tp4-data", "vllm-tp8-skip-profiling",
        "vllm-tp4-batched-65536", "vllm-no-images", "sglang-tp8", "sglang-tp32", "sglang-dp16-attention",
        "sglang-dp8-attention"])
def test_the_pools_lose_what_the_engine_keeps_of_the_tower(kind: str, tp: int, dp: int, args: dict[str, object],
                                                          serving: dict[str, int], pool: int) -> None:
    """What the vision tower takes from the KV and state pools per GPU, derived by hand from the engines' source
    (planning/vision.py cites it). The budget's non-expert line already counts the tower / attn_tp
    (802,000,000 / TP B); what the engine holds beyond that, and vLLM's profiled encoder outputs, come out of the
    pools:
    - vLLM shards the tower when TP divides its 12 heads (TP 4: 200,500,000 B a rank, all counted), else (TP 8, 16,
      32) or with --mm-encoder-tp-mode data holds all 802,000,000 B on every rank: 701,750,000 B more than the
      line counts at TP 8, 751,875,000 at 16, 776,937,500 at 32, 601,500,000 at TP 4 in data mode.
    - vLLM's profile run keeps max(1, min(max(--max-num-batched-tokens, T) // T, max_num_seqs x images a prompt
      holds)) largest images' embeddings through the language model's peak: T = 16,817 tokens (1861 x 7041 px),
      x 7,168 (hidden) x 2 B = 241,088,512 B each; one image at the default batch (8,192 < T), three at 65,536
      (65,536 // 16,817); none with --skip-mm-profiling; no tower at all when no image is allowed.
    - SGLang keeps the tower whole on every rank whatever the image limit: 701,750,000 B beyond the line at attn_tp
      8, 776,937,500 at 32; with DP attention over TP 16, none at DP 16 (attn_tp 1: the line counts the whole
      tower), 401,000,000 at DP 8 (attn_tp 2). vLLM's TP 4 runs DP 2 x EP 8 here (K3 needs 8 GPUs' memory)."""
    doc = topology_dict(gpu="b300", per_node=8, nodes=max(1, tp * dp // 8 if kind == "vllm" else tp // 8), kind=kind,
                        tp=tp, ep=tp * dp if kind == "vllm" else tp, dp=dp, **serving)
    if kind == "sglang" and dp > 1:
        doc["parallel"]["attention_dp"] = True
    doc["engine"]["args"] = args
    plan = plan_of(doc)
    m, v = plan.memory, plan.vision
    assert m is not None and v is not None, plan.issues
    assert m.vision_bytes == v.pool_bytes == pool
    if kind == "vllm":
        assert m.kv_pool_bytes + m.state_pool_bytes == int(m.usable_bytes * m.mem_fraction - m.weights_bytes
                                                           - m.reserve_bytes - pool)
    else:
        assert m.kv_pool_bytes + m.state_pool_bytes == int((m.usable_bytes - m.engine_preload_bytes) * m.mem_fraction
                                                           - m.weights_bytes - pool
                                                           - (m.engine_static_bytes - m.engine_preload_bytes))
    lines = m.weights_bytes + m.reserve_bytes + m.engine_static_bytes + m.vision_bytes
    assert lines + m.kv_pool_bytes + m.state_pool_bytes + m.headroom_bytes == m.usable_bytes


def test_the_largest_image_is_the_one_vllm_profiles_with() -> None:
    """The catalog's max_image_tokens is KimiK3ProcessingInfo.get_max_image_size's search (mm_preprocess.py
    @25c255b9) over the processor arithmetic: every side (n + 1) x 14 - 1 px up to 512 patches, the most tokens
    (then patches) winning; about 0.7 s."""
    v = load_catalog().models["kimi-k3"].vision
    assert v is not None
    side, p = v.patch_limit_on_one_side, v.patch_size
    best, size = (-1, -1), (0, 0)
    for wp in range(side + 1):
        w = min((wp + 1) * p - 1, side * p)
        for hp in range(wp, side + 1):
            h = min((hp + 1) * p - 1, side * p)
            r = image_tokens(v, w, h)
            score = (r.tokens, (r.scaled_width + r.pad_width) // p * ((r.scaled_height + r.pad_height) // p))
            if score > best:
                best, size = score, (w, h)
    assert (best[0], size) == (v.max_image_tokens, (1861, 7041))
