"""A torch Dataset over word-problem data, one word per item."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from implicitlm.data.groups import get_group
from implicitlm.data.words import WordData


class WordDataset(Dataset):
    """Items are ``{"input_ids": (L,), "labels": (L,)}`` int64 tensors; labels are aligned
    prefix products, so a loss must compare position t with position t (no shift)."""

    def __init__(self, data: WordData) -> None:
        self.data = data
        self.vocab_size = get_group(data.group).order

    def __len__(self) -> int:
        return int(self.data.inputs.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        # Copying into int64 also detaches the item from a read-only memory map.
        return {
            "input_ids": torch.from_numpy(np.array(self.data.inputs[index], dtype=np.int64)),
            "labels": torch.from_numpy(np.array(self.data.targets[index], dtype=np.int64)),
        }
