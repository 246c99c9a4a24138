python3 -m pytest -m gpu -q -x tests/test_kernels.py tests/test_session.py 2>&1 | tail -15
python3 benchmarks/kernels.py --matmul-sweep 2>&1 | tail -20
python3 benchmarks/kernels.py --sweep 2>&1 | grep cumsum
