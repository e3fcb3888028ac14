"""Shared test set-up: one intra-op thread (2 cores are shared by many processes)."""

import torch

torch.set_num_threads(1)
