"""all_reduce (tilelink/ops/all_reduce.py): `test_copy_engine.py` (comm=copy_engine) and
`test_two_shot.py` (allreduce=two_shot on SMs), two files because each resource's tests
carry the same names."""
