"""all_to_all (tilelink/ops/all_to_all): `test_sm.py` (the kernel on SMs and the
expert-parallel dispatch -> gemm -> combine pattern) and `test_topk.py` (top-k routing: the
landing positions computed on the device and the combine as a receive step)."""
