"""Tests of the op families (tilelink/ops), one place per family: `test_<family>.py`, or
`<family>/test_<aspect>.py` where a family's tests are several files.

Each module's docstring says what it covers; a test that runs two families (an expert-parallel
pattern: all_to_all and grouped_gemm) is with the family whose lowering it mainly checks.
Cross-cutting tests (the API, the CLI, codegen, the emulated world, the cost model, bench,
docs, the model layers) stay in tests/."""
