"""Stdlib-only probe shipped by source to every node: one JSON line of raw facts about the host.

It judges nothing (k3deploy parses and judges on its side, so every parser is tested there). Argument:
one JSON object {iface, model_path, engine_python, engine_query, tools: {name: argv}, shm_path}.
"""
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time

TOOL_TIMEOUT_S = 20.0
ENGINE_TIMEOUT_S = 60.0
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def run(argv, timeout_s):
    """{exit, out, err} of a command; exit None when it could not run."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        return {"exit": p.returncode, "out": p.stdout[-20000:], "err": p.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        return {"exit": None, "out": "", "err": f"timed out after {timeout_s:g} s"}
    except OSError as exc:
        return {"exit": None, "out": "", "err": str(exc)}


def host_facts():
    name = socket.gethostname()
    try:
        addrs = sorted({ai[4][0] for ai in socket.getaddrinfo(name, None)})
        error = ""
    except OSError as exc:
        addrs, error = [], str(exc)
    return {"hostname": name, "resolves_to": addrs, "resolve_error": error}


def iface_facts(iface):
    base = os.path.join("/sys/class/net", iface)
    if not os.path.exists(base):
        return {"present": False, "all": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []}

    def read(name):
        try:
            with open(os.path.join(base, name)) as fh:
                return fh.read().strip()
        except OSError:
            return ""

    ip_tool = shutil.which("ip") or next((p for p in ("/sbin/ip", "/usr/sbin/ip", "/bin/ip") if os.path.exists(p)), None)
    addr = run([ip_tool, "-o", "addr", "show", "dev", iface], TOOL_TIMEOUT_S) if ip_tool else None
    return {"present": True, "operstate": read("operstate"), "flags": read("flags"), "mtu": read("mtu"),
            "ip_addr": addr["out"] if addr and addr["exit"] == 0 else None}


def checkpoint_facts(path):
    out = {"path": path, "is_dir": os.path.isdir(path), "index": None, "shards": 0, "missing_shards": [],
           "architectures": [], "revision": None, "free_bytes": None}
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe) if probe != "/" else ""
    if probe:
        out["free_bytes"] = shutil.disk_usage(probe).free
    if not out["is_dir"]:
        return out
    try:
        if not os.path.exists(os.path.join(path, INDEX_FILE)) and os.path.isfile(os.path.join(path, SINGLE_FILE)):
            files = [SINGLE_FILE]  # the single-file form: the engines load it without an index
            out["single_file"] = True
        else:
            with open(os.path.join(path, INDEX_FILE)) as fh:
                files = sorted(set(json.load(fh).get("weight_map", {}).values()))
        out["index"] = True
        out["shards"] = len(files)
        out["missing_shards"] = [f for f in files if not os.path.isfile(os.path.join(path, f))][:20]
    except (OSError, ValueError, AttributeError) as exc:
        out["index"] = False
        out["index_error"] = str(exc)[:300]
    try:
        with open(os.path.join(path, "config.json")) as fh:
            out["architectures"] = list(json.load(fh).get("architectures") or [])
    except (OSError, ValueError, AttributeError):
        pass
    # `hf download --local-dir` keeps the commit of every file here (first line of each .metadata).
    meta = os.path.join(path, ".cache", "huggingface", "download")
    revisions = set()
    for root, _dirs, names in os.walk(meta):
        for n in names[:50]:
            if n.endswith(".metadata"):
                try:
                    with open(os.path.join(root, n)) as fh:
                        revisions.add(fh.readline().strip())
                except OSError:
                    pass
    out["revision"] = sorted(revisions) or None
    return out


def shm_facts(path):
    try:
        u = shutil.disk_usage(path)
        return {"total": u.total, "free": u.free}
    except OSError as exc:
        return {"error": str(exc)}


def main():
    spec = json.loads(sys.argv[1])
    facts = {"time": time.time(), "python": platform.python_version(), "host": host_facts(),
             "iface": iface_facts(spec["iface"]) if spec.get("iface") else None,
             "checkpoint": checkpoint_facts(spec["model_path"]), "shm": shm_facts(spec.get("shm_path", "/dev/shm")),
             "tools": {}}
    for name, argvs in spec.get("tools", {}).items():
        if shutil.which(argvs[0][0]):
            facts["tools"][name] = [run(a, TOOL_TIMEOUT_S) for a in argvs]
    query = spec.get("engine_query")
    if query:
        archs = facts["checkpoint"]["architectures"]
        facts["engine"] = run([*query, json.dumps(archs)], ENGINE_TIMEOUT_S)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
