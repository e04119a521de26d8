"""A tiny bAbI-format sample, written for this project (no text of the real bAbI tasks).

Five task types in the en-valid layout (``qaN_train.txt``, ``qaN_valid.txt``, ``qaN_test.txt``):
1 single supporting fact, 6 yes/no questions, 8 lists (answers like ``lamp,kite``),
15 deduction, 19 path finding (answers like ``n,w``). Stories restart their line ids at 1,
and some ask a question before their last fact, as the real files do. Tests and
``implicitlm catbabi sample`` use it; it is far too small to learn from.
"""

from __future__ import annotations

import os
from pathlib import Path

from implicitlm.core.targets import FolderKind, staged_folder

SAMPLE_TASKS = (1, 6, 8, 15, 19)

# (task, split) -> file text. Questions are "ID question?<TAB>answer<TAB>supporting line ids".
SAMPLE_FILES: dict[tuple[int, str], str] = {
    (1, "train"): """\
1 Ada walked to the garden.
2 Bruno went to the cellar.
3 Where is Ada?\tgarden\t1
4 Chloe ran to the library.
5 Ada went to the attic.
6 Where is Ada?\tattic\t5
1 Dmitri moved to the porch.
2 Chloe walked to the cellar.
3 Where is Dmitri?\tporch\t1
4 Dmitri went to the library.
5 Bruno ran to the porch.
6 Where is Bruno?\tporch\t5
""",
    (1, "valid"): """\
1 Bruno walked to the attic.
2 Ada went to the porch.
3 Where is Bruno?\tattic\t1
""",
    (1, "test"): """\
1 Chloe went to the garden.
2 Dmitri ran to the attic.
3 Where is Chloe?\tgarden\t1
4 Chloe walked to the cellar.
5 Where is Chloe?\tcellar\t4
""",
    (6, "train"): """\
1 Ada went to the library.
2 Is Ada in the library?\tyes\t1
3 Bruno walked to the garden.
4 Is Bruno in the attic?\tno\t3
""",
    (6, "valid"): """\
1 Chloe ran to the porch.
2 Is Chloe in the cellar?\tno\t1
""",
    (6, "test"): """\
1 Dmitri went to the cellar.
2 Is Dmitri in the cellar?\tyes\t1
""",
    (8, "train"): """\
1 Ada picked up the lamp.
2 Ada went to the garden.
3 What is Ada carrying?\tlamp\t1
4 Ada took the kite.
5 What is Ada carrying?\tlamp,kite\t1 4
6 Ada dropped the lamp.
7 What is Ada carrying?\tkite\t4 6
1 Bruno went to the attic.
2 Bruno grabbed the kite.
3 Bruno picked up the lamp.
4 What is Bruno carrying?\tkite,lamp\t2 3
""",
    (8, "valid"): """\
1 Chloe took the apple.
2 Chloe got the kite.
3 What is Chloe carrying?\tapple,kite\t1 2
""",
    (8, "test"): """\
1 Dmitri picked up the apple.
2 Dmitri went to the porch.
3 Dmitri took the lamp.
4 What is Dmitri carrying?\tapple,lamp\t1 3
""",
    (15, "train"): """\
1 Wolves are afraid of cats.
2 Sheep are afraid of wolves.
3 Cats are afraid of sheep.
4 Ada is a wolf.
5 Bruno is a sheep.
6 What is Ada afraid of?\tcats\t4 1
7 What is Bruno afraid of?\twolves\t5 2
""",
    (15, "valid"): """\
1 Mice are afraid of cats.
2 Cats are afraid of wolves.
3 Chloe is a cat.
4 What is Chloe afraid of?\twolves\t3 2
""",
    (15, "test"): """\
1 Cats are afraid of mice.
2 Mice are afraid of wolves.
3 Dmitri is a mouse.
4 What is Dmitri afraid of?\twolves\t3 2
""",
    (19, "train"): """\
1 The attic is north of the cellar.
2 The garden is west of the attic.
3 The library is south of the cellar.
4 How do you go from the cellar to the garden?\tn,w\t1 2
1 The porch is east of the library.
2 The cellar is north of the porch.
3 How do you go from the library to the cellar?\te,n\t1 2
""",
    (19, "valid"): """\
1 The garden is south of the porch.
2 The attic is east of the garden.
3 How do you go from the porch to the attic?\ts,e\t1 2
""",
    (19, "test"): """\
1 The library is west of the garden.
2 The cellar is south of the library.
3 How do you go from the garden to the cellar?\tw,s\t1 2
""",
}

# The folder of the sample: its task files, any of which marks it.
SAMPLE_NAMES = tuple(f"qa{task}_{split}.txt" for task, split in SAMPLE_FILES)
SAMPLE_FOLDER = FolderKind("the bAbI sample", marks=SAMPLE_NAMES, entries=SAMPLE_NAMES)


def write_babi_sample(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write the sample's task files as the folder ``out_dir``; returns it. A folder that
    holds anything is refused unless ``overwrite``, which replaces the sample's files in a
    folder that holds them, and keeps any other."""
    out_dir = Path(out_dir)
    with staged_folder(out_dir, overwrite, SAMPLE_FOLDER) as staging:
        for (task, split), text in SAMPLE_FILES.items():
            (staging / f"qa{task}_{split}.txt").write_text(text)
    return out_dir
