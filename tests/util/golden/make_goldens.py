#!/usr/bin/env python3
"""Golden files for the .npy and safetensors code, made by the independent implementations
(numpy; huggingface safetensors + torch + transformers). Run from the repo root on a machine with
them (the GPU machine); writes OUT/goldens.tar.gz (paths relative to the repo root) and prints a
summary. Inputs, written by our C++ tests beforehand:
  tests/util/golden/sy_written/*.npy                (SY_WRITE_NPY_FOR_NUMPY=1 test_util)
  tests/model/safetensors_golden/sy_written/         (SY_WRITE_SAFETENSORS_FOR_HF=1 test_model)
  fuzz/corpus/safetensors/*.safetensors              (SY_DUMP_SAFETENSORS_CASES=... test_model)
"""
import io
import json
import os
import sys
import tarfile
import traceback

import numpy as np

OUT = os.environ.get("OUT", "/tmp/goldens_out")
files = {}  # repo-relative path -> bytes
versions = {"python": sys.version.split()[0], "numpy": np.__version__}


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def put(path, data):
    files[path] = data if isinstance(data, bytes) else data.encode()


def put_json(path, obj):
    put(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


SY_DTYPE = {"uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "uint32": "U32",
            "int32": "I32", "uint64": "U64", "int64": "I64", "float16": "F16", "float32": "F32",
            "float64": "F64", "bool": "BOOL"}


def npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=True)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


def numpy_goldens():
    rng = np.random.default_rng(20240611)
    ok = {
        "u8_3x4.npy": rng.integers(0, 256, (3, 4), dtype=np.uint8),
        "u16_2x3x5.npy": rng.integers(0, 65536, (2, 3, 5), dtype=np.uint16),
        "i32_0x4.npy": np.zeros((0, 4), dtype=np.int32),
        "i32_6.npy": rng.integers(-2**31, 2**31, (6,), dtype=np.int32),
        "f32_7.npy": rng.standard_normal(7).astype(np.float32),
        "f32_2x0x3.npy": np.zeros((2, 0, 3), dtype=np.float32),
        "f16_2x2.npy": rng.standard_normal((2, 2)).astype(np.float16),
        "f64_3.npy": rng.standard_normal(3),
        "i8_4.npy": np.array([-128, -1, 0, 127], dtype=np.int8),
        "i16_3.npy": np.array([-32768, 5, 32767], dtype=np.int16),
        "u32_2.npy": np.array([0, 2**32 - 1], dtype=np.uint32),
        "u64_2.npy": np.array([0, 2**64 - 1], dtype=np.uint64),
        "i64_scalar.npy": np.array(-(2**62) - 7, dtype=np.int64),
        "bool_5.npy": np.array([True, False, True, True, False]),
        "routes_u8_5x4x2.npy": rng.integers(0, 128, (5, 4, 2), dtype=np.uint8),
    }
    manifest = {}
    for name, arr in ok.items():
        put(f"tests/util/golden/numpy/{name}", npy_bytes(arr))
        manifest[name] = {"expect": "ok", "descr": arr.dtype.str, "shape": list(arr.shape),
                          "sy_dtype": SY_DTYPE[arr.dtype.name], "values": arr.reshape(-1).tolist()}
    for version in [(2, 0), (3, 0)]:
        arr = rng.integers(0, 65536, (2, 3), dtype=np.uint16)
        name = f"u16_2x3_v{version[0]}.npy"
        try:
            put(f"tests/util/golden/numpy/{name}", npy_bytes(arr, version))
            manifest[name] = {"expect": "ok", "descr": arr.dtype.str, "shape": list(arr.shape),
                              "sy_dtype": "U16", "values": arr.reshape(-1).tolist()}
        except Exception as e:  # numpy may refuse 3.0 for plain dtypes
            print("skip", name, e)
    rejects = {
        "reject_fortran.npy": (np.asfortranarray(rng.standard_normal((2, 3)).astype(np.float32)), "fortran_order True"),
        "reject_big_endian.npy": (np.arange(3, dtype=">i4"), "big-endian"),
        "reject_complex.npy": (np.arange(2, dtype=np.complex64), "complex dtype"),
        "reject_structured.npy": (np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]), "structured dtype"),
        "reject_object.npy": (np.array([1, "x"], dtype=object), "pickled objects"),
    }
    for name, (arr, why) in rejects.items():
        put(f"tests/util/golden/numpy/{name}", npy_bytes(arr))
        manifest[name] = {"expect": "reject", "why": why, "descr": str(arr.dtype.descr)}
    put_json("tests/util/golden/numpy/manifest.json", {"files": manifest, "versions": versions})
    print("numpy goldens:", len(manifest))


def numpy_reads_ours():
    src = "tests/util/golden/sy_written"
    report = {}
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        raw = open(path, "rb").read()
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(f)
        arr = np.load(path, allow_pickle=False)
        report[name] = {"fnv1a64": fnv1a64(raw), "version": list(version), "descr": arr.dtype.str,
                        "fortran_order": bool(fortran), "shape": list(arr.shape),
                        "sy_dtype": SY_DTYPE[arr.dtype.name], "values": arr.reshape(-1).tolist()}
    put_json("tests/util/golden/numpy_read_sy.json", {"files": report, "versions": versions})
    print("numpy read our files:", len(report))


def safetensors_part():
    import torch
    import safetensors
    from safetensors import safe_open
    from safetensors.torch import save_file, load_file
    versions["torch"] = torch.__version__
    versions["safetensors"] = safetensors.__version__
    name_of = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32",
               torch.int8: "I8", torch.bool: "BOOL", torch.uint8: "U8", torch.int64: "I64",
               torch.float64: "F64", torch.int16: "I16"}

    def describe(t, file=None):
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        d = {"dtype": name_of[t.dtype], "shape": list(t.shape), "fnv1a64": fnv1a64(raw), "nbytes": len(raw)}
        if file is not None:
            d["file"] = file
        return d

    base = "tests/model/safetensors_golden"
    # 1. A file written by safetensors.torch.save_file.
    g = torch.Generator().manual_seed(7)
    tensors = {
        "embed.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(4, generator=g).to(torch.float16),
        "proj.weight": torch.randn(3, 5, generator=g),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "ids": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "mask": torch.tensor([True, False, True]),
        "q": torch.tensor([-3, 4, 127], dtype=torch.int8),
    }
    tmp = "/tmp/hf_single.safetensors"
    save_file(tensors, tmp, metadata={"format": "pt", "writer": "safetensors.torch.save_file"})
    put(f"{base}/hf_single/model.safetensors", open(tmp, "rb").read())
    put_json(f"{base}/hf_single/manifest.json",
             {"tensors": {k: describe(v) for k, v in tensors.items()},
              "metadata": {"format": "pt", "writer": "safetensors.torch.save_file"}, "versions": versions})

    # 2. A sharded checkpoint written by transformers' save_pretrained.
    try:
        import transformers
        versions["transformers"] = transformers.__version__
        out_dir = "/tmp/hf_sharded"
        torch.manual_seed(0)
        try:
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
            cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                 num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
            model = Qwen3MoeForCausalLM(cfg)
        except Exception as e:
            print("Qwen3Moe unavailable, using Llama:", e)
            from transformers import LlamaConfig, LlamaForCausalLM
            cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
            model = LlamaForCausalLM(cfg)
        model = model.to(torch.bfloat16)
        model.save_pretrained(out_dir, max_shard_size="8KB", safe_serialization=True)
        manifest = {}
        for name in sorted(os.listdir(out_dir)):
            put(f"{base}/hf_sharded/{name}", open(os.path.join(out_dir, name), "rb").read())
            if name.endswith(".safetensors"):
                for k, v in load_file(os.path.join(out_dir, name)).items():
                    manifest[k] = describe(v, name)
        put_json(f"{base}/hf_sharded/manifest.json", {"tensors": manifest, "versions": versions,
                                                      "files": sorted(os.listdir(out_dir))})
        print("transformers sharded files:", sorted(os.listdir(out_dir)))
    except Exception:
        traceback.print_exc()

    # 3. What the reference reads from the checkpoints our writer made.
    report = {}
    sy_dir = f"{base}/sy_written"
    for layout in sorted(os.listdir(sy_dir)):
        folder = os.path.join(sy_dir, layout)
        entry = {"tensors": {}, "metadata": {}}
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(".safetensors"):
                with safe_open(path, framework="pt") as f:
                    entry["metadata"][name] = f.metadata()
                    for k in f.keys():
                        entry["tensors"][k] = describe(f.get_tensor(k), name)
            elif name.endswith(".index.json"):
                entry["index"] = json.load(open(path))
        report[layout] = entry
    put_json(f"{base}/hf_read_sy.json", {"layouts": report, "versions": versions})
    print("reference read our checkpoints:", {k: len(v["tensors"]) for k, v in report.items()})

    # 4. The reference's verdict on every case of our fuzz corpus.
    verdicts = {}
    corpus = "fuzz/corpus/safetensors"
    for name in sorted(os.listdir(corpus)):
        path = os.path.join(corpus, name)
        try:
            with safe_open(path, framework="pt") as f:
                keys = list(f.keys())
                f.metadata()
            verdicts[name] = {"accepted": True, "tensors": len(keys)}
        except Exception as e:
            verdicts[name] = {"accepted": False, "error": f"{type(e).__name__}: {e}"[:300]}
    put_json(f"{base}/reference_verdicts.json", {"cases": verdicts, "versions": versions})
    print("reference verdicts:", sum(v["accepted"] for v in verdicts.values()), "accepted of", len(verdicts))


def main():
    for part in (numpy_goldens, numpy_reads_ours, safetensors_part):
        try:
            part()
        except Exception:
            traceback.print_exc()
    put_json("tests/util/golden/versions.json", versions)
    print("versions:", versions)
    os.makedirs(OUT, exist_ok=True)
    with tarfile.open(os.path.join(OUT, "goldens.tar.gz"), "w:gz") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    print("wrote", len(files), "files")


if __name__ == "__main__":
    main()
