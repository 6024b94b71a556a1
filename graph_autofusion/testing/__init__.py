"""Test machinery that ships with the engine, so the test suite and the benchmarks share it.

random_graphs   seeded random ONNX graphs drawn from the op registry, with inputs and
                float64 "truth" values computed node by node
differential    fuse + compile + run those graphs and judge them against onnxruntime
"""
