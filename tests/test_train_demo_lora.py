"""scripts/train_demo_lora.py: the Google-style rewrite of the corpus's docstrings (its training data), the
check that scores a model's docstring, and (slow tier) two training steps of the script end to end."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SOURCE = textwrap.dedent('''\
    def basename(p):
        """Returns the final component of a pathname.

        Longer prose that the rewrite drops.
        """
        return p.rsplit("/", 1)[-1]


    class Box:
        def put(self, item: int, *rest, key=None, **options):
            """Store an item, which
            may be large."""
            self.items.append(item)

        def oneliner(self): """Not on its own line: skipped."""

        def nothing(self):
            """Do nothing at all."""
            pass
    ''')


def google_docstrings():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from demo_model import google_docstrings as module
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def test_the_rewrite_lists_parameters_and_what_is_returned():
    gd = google_docstrings()
    fns = {fn.name: fn for fn in gd.documented_functions(SOURCE)}
    assert set(fns) == {"basename", "put", "nothing"}
    assert fns["basename"].prompt == 'def basename(p):\n    """'
    assert fns["basename"].rewritten() == textwrap.dedent('''\
        def basename(p):
            """Returns the final component of a pathname.

            Args:
                p: The p.

            Returns:
                The final component of a pathname.
            """
            return p.rsplit("/", 1)[-1]


        ''')
    put = fns["put"]
    assert put.params == ("item (int)", "*rest", "key", "**options") and not put.returns_value
    assert put.google_docstring() == textwrap.indent(textwrap.dedent('''\
        """Store an item, which may be large.

        Args:
            item (int): The item.
            *rest: The rest.
            key: The key.
            **options: The options.
        """
        '''), "        ")
    assert fns["nothing"].google_docstring() == '        """Do nothing at all."""\n'


def test_a_docstring_is_google_style_when_its_args_name_every_parameter():
    gd = google_docstrings()
    put = next(fn for fn in gd.documented_functions(SOURCE) if fn.name == "put")
    good = ('Store it.\n\n        Args:\n            item (int): The item.\n            *rest: The rest.\n'
            '            key: The key.\n            **options: The options.\n        """\n        pass')
    assert gd.is_google_style(put, good)
    assert not gd.is_google_style(put, good.replace("            key: The key.\n", ""))
    assert not gd.is_google_style(put, "Store it.\n        item: the item\n        \"\"\"")
    # an Args section after the docstring's end does not count
    assert not gd.is_google_style(put, 'Store it."""\n    """Args:\n        item: x\n        rest: x\n        key: x\n'
                                       '        options: x')


@pytest.mark.slow
def test_two_steps_of_the_script_write_a_peft_folder(tmp_path):
    spec = importlib.util.spec_from_file_location("train_demo_lora", SCRIPTS / "train_demo_lora.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        log = module.main(["--out", str(tmp_path), "--steps", "2", "--batch-size", "2", "--eval-prompts", "2",
                           "--max-new-tokens", "4", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["peft_type"] == "LORA"
    assert (tmp_path / "adapter_model.safetensors").is_file()
    assert log["eval"]["prompts"] == 2 and [h["step"] for h in log["history"]] == [1, 2]
    assert json.loads((tmp_path / "train_log.json").read_text())["eval"] == log["eval"]
