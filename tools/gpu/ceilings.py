"""The two ceilings every GPU figure is compared with, measured on the card as found (no clock
changes): device-to-device copy bandwidth (bytes read + written) and the bf16 matmul rate on
random data, each the median of timed repeats after warm-up. Prints one JSON object."""
import json
import torch

def timed(fn, repeats):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]

src = torch.randn(1 << 30, device="cuda", dtype=torch.float32)  # 4 GiB
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
copy_s = timed(lambda: dst.copy_(src), 10)
bandwidth = 2 * src.numel() * 4 / copy_s / 1e9
del src, dst
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
mm_s = timed(lambda: a @ b, 10)
print(json.dumps({"device": torch.cuda.get_device_name(), "copy_bandwidth_gbs": round(bandwidth, 1),
                  "bf16_matmul_tflops": round(2 * n ** 3 / mm_s / 1e12, 1)}))
