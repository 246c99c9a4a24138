set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
python3 -m pytest -m gpu -q -x tests/test_kernels.py 2>&1 | tail -15
python3 benchmarks/kernels.py --sweep 2>&1 | tail -30
ncu --clock-control none -k regex:matmul_bf16_pipelined -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats python3 probe_ncu.py matmul 2>&1 | grep -v "^==PROF==" | tail -80
ncu --clock-control none -k regex:scan_single_pass -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats python3 probe_ncu.py scan 2>&1 | grep -v "^==PROF==" | tail -60
