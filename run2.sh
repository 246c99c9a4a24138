python3 -m pytest -m gpu -q -x tests/test_kernels.py -k "matmul or scan or compile" 2>&1 | tail -5
python3 benchmarks/kernels.py --matmul-sweep 2>&1 | grep wgmma
python3 benchmarks/kernels.py --sweep 2>&1 | grep -E "cumsum|softmax split regs  8  512|transpose"
