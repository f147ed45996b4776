"""Test-wide settings.

Tests run on small problems where one thread is as fast as two, and several test processes (or other
work) may share the machine's cores: oversubscribed OpenMP threads slow small dense kernels (eigh,
QR) down by orders of magnitude, so the suite pins torch to one thread.
"""
import torch

torch.set_num_threads(1)
