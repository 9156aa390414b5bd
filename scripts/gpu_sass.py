#!/usr/bin/env python3
"""Registers, spills and the SASS of nectar-cuda's kernels, without a GPU run (docs/gpu.md).

    scripts/gpu_sass.py gemv_tc_i4_t4 [KERNEL ...] [--dump DIR]

The kernels ship as CUDA source that NVRTC compiles at run time and the driver turns into SASS;
a kernel's speed on the H200 follows its instruction count and registers (RESULTS 2026-12-04),
so read them before timing a change. Sources are concatenated in `device.rs`'s order. With
`nvcc` on PATH (the GPU machine: /usr/local/cuda/bin) and no `NVRTC` set it compiles for sm_90
directly; otherwise it needs NVRTC (`NVRTC=path/to/libnvrtc.so.13`) and `ptxas` on PATH — the pip wheels
nvidia-cuda-nvrtc / nvidia-cuda-nvcc / nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm of the
driver's CUDA version give the same toolchain. `cuobjdump` and `nvdisasm` must be on PATH.
For each kernel: ptxas's registers and spills, then each backward branch's loop with its
instruction count and opcode histogram."""
import collections
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "nectar-cuda", "src")


def source():
    device = open(os.path.join(ROOT, "device.rs")).read()
    block = device[device.index("const KERNEL_SOURCE"):]
    block = block[: block.index(");")]
    return "".join(open(os.path.join(ROOT, f)).read() for f in re.findall(r'include_str!\("([^"]+)"\)', block))


def ptx_by_nvrtc(src):
    lib = ctypes.CDLL(os.environ.get("NVRTC", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"nectar.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
    status = lib.nvrtcCompileProgram(prog, 1, opts)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status:
        sys.exit(f"NVRTC failed:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value


def loops(sass):
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            ops = collections.Counter(t.split()[1] if t.startswith("@") else t.split()[0] for t in body)
            yield int(m.group(1), 16), addr, len(body), ops


def main():
    args = sys.argv[1:]
    dump = None
    if "--dump" in args:
        i = args.index("--dump")
        dump, args = args[i + 1], args[:i] + args[i + 2:]
    if not args:
        sys.exit(__doc__)
    tmp = tempfile.mkdtemp()
    cu, cubin = os.path.join(tmp, "nectar.cu"), os.path.join(tmp, "nectar.cubin")
    src = source()
    open(cu, "w").write(src)
    if shutil.which("nvcc") and "NVRTC" not in os.environ:
        out = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", cubin, cu],
                             capture_output=True, text=True)
    else:
        ptx = os.path.join(tmp, "nectar.ptx")
        open(ptx, "wb").write(ptx_by_nvrtc(src))
        out = subprocess.run(["ptxas", "-arch=sm_90", "-v", "-o", cubin, ptx], capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    info = out.stderr
    for k in args:
        m = re.search(rf"Function properties for {re.escape(k)}\n([^\n]*spill[^\n]*)\n([^\n]*Used[^\n]*)", info)
        if not m:
            print(f"{k}: no such kernel")
            continue
        print(f"{k}: " + " | ".join(x.split(":", 1)[-1].strip() for x in m.groups()))
        sass = subprocess.run(["cuobjdump", "-sass", "-fun", k, cubin], capture_output=True, text=True).stdout
        if dump:
            os.makedirs(dump, exist_ok=True)
            open(os.path.join(dump, f"{k}.sass"), "w").write(sass)
        for start, end, n, ops in loops(sass):
            print(f"  loop {start:#x}..{end:#x}: {n} instructions")
            print("    " + ", ".join(f"{op} {c}" for op, c in ops.most_common(16)))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
