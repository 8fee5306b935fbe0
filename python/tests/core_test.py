"""dpcheck._core and dpcheck.torch in one process: the share judge, the element locator, the gradient
judge's weights and its "not judged" answers, each shown to fail where it must and pass where it must."""

import json
import os
import shutil
import tempfile
import unittest

import numpy as np
import torch

from dpcheck import _core
from dpcheck import torch as dtorch


def shares(*ranks):
    return [np.asarray(r, dtype=np.int64) for r in ranks]


class Shares(unittest.TestCase):
    def test_disjoint_cover_passes(self):
        v = _core.judge_epoch(0, 6, shares([0, 2, 4], [1, 3, 5]), None, False, False)
        self.assertTrue(v["passed"], v["message"])
        self.assertIn("2 ranks draw 3 examples each of 6, disjoint, covering the data", v["message"])

    def test_overlap_names_the_example_and_ranks(self):
        v = _core.judge_epoch(0, 6, shares([0, 1, 2], [2, 3, 4]), None, False, False)
        self.assertFalse(v["passed"])
        self.assertIn("example 2 (ranks 0 and 1) is drawn more than once, and example 5 by no rank", v["message"])

    def test_padding_is_reported_and_fails_only_when_strict(self):
        s = shares([3, 0], [1, 4], [2, 3])  # 5 examples on 3 ranks: example 3 pads the last share
        lenient = _core.judge_epoch(0, 5, s, None, True, False)
        self.assertTrue(lenient["passed"], lenient["message"])
        self.assertTrue(lenient["padded"])
        self.assertEqual(lenient["repeated"], [(3, [0, 2])])
        strict = _core.judge_epoch(0, 5, s, None, True, True)
        self.assertFalse(strict["passed"])
        self.assertIn("strict shares were asked for", strict["message"])

    def test_unsplit_data(self):
        v = _core.judge_epoch(0, 3, shares([0, 1, 2], [0, 1, 2]), None, None, False)
        self.assertIn("every rank draws all 3 examples", v["message"])

    def test_repeated_shuffle_fails_and_repeated_order_without_shuffle_passes(self):
        first = shares([2, 0], [3, 1])
        self.assertFalse(_core.judge_epoch(1, 4, first, first, True, False)["passed"])
        # Unknown whether it shuffles: the order is not ascending, so it does.
        self.assertFalse(_core.judge_epoch(1, 4, first, first, None, False)["passed"])
        plain = shares([0, 2], [1, 3])
        self.assertTrue(_core.judge_epoch(1, 4, plain, plain, None, False)["passed"])
        self.assertTrue(_core.judge_epoch(1, 4, shares([0, 2], [3, 1]), first, True, False)["passed"])

    def test_outside_the_data(self):
        v = _core.judge_epoch(0, 4, shares([0, 1], [2, 7]), None, False, False)
        self.assertIn("rank 1 draws example 7, outside the data set's [0, 4)", v["message"])


class Locate(unittest.TestCase):
    def test_float32_minority_and_ulps(self):
        a = np.zeros((2, 3), dtype=np.float32)
        b = a.copy()
        b[1, 2] = np.nextafter(np.float32(0), np.float32(1))
        d = _core.locate("float32", [a, a, b], [2, 3])
        self.assertTrue(d["differs"])
        self.assertEqual(d["index"], "[1, 2]")
        self.assertEqual(d["minority"], [2])
        self.assertEqual(d["distance"], 1)
        self.assertEqual(d["differing"], 1)

    def test_equal_copies_and_integers(self):
        a = np.arange(4, dtype=np.int64)
        self.assertFalse(_core.locate("int64", [a, a], [4])["differs"])
        b = a.copy()
        b[3] = -5
        d = _core.locate("int64", [a, b], [4])
        self.assertEqual((d["flat_index"], d["distance"], d["unit"]), (3, 8, ""))

    def test_bfloat16_ulps(self):
        a = torch.tensor([1.0], dtype=torch.bfloat16)
        b = torch.tensor([1.0078125], dtype=torch.bfloat16)  # the next bfloat16 above 1
        d = _core.locate("bfloat16", [dtorch._as_array(a), dtorch._as_array(b)], [1])
        self.assertEqual(d["distance"], 1)

    def test_hash_is_xxh3_of_the_bytes(self):
        x = np.arange(10, dtype=np.float32)
        self.assertEqual(_core.hash(x), _core.hash(x.copy()))
        self.assertNotEqual(_core.hash(x), _core.hash(x + 1))
        with self.assertRaises(ValueError):
            _core.hash(np.arange(10, dtype=np.float32)[::2])


class Gradient(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
        self.x = torch.randn(5, 3)
        self.y = torch.randn(5, 2)
        fam, why = dtorch.model_family(self.model)
        self.assertIsNotNone(fam, why)
        self.family = fam
        self.params = torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).numpy()

    def gradient(self, weights):
        """The gradient of sum_k w_k l_k, with l_k example k's mse."""
        self.model.zero_grad()
        per = ((self.model(self.x) - self.y) ** 2).mean(dim=1)
        (per * torch.tensor(weights)).sum().backward()
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()]).numpy()

    def judge(self, weights):
        parts = [(0, self.x[:3].numpy(), self.y[:3].numpy()), (1, self.x[3:].numpy(), self.y[3:].numpy())]
        return _core.judge_gradient(self.family["dims"], "tanh", "mse", self.params, parts,
                                    self.gradient(weights), 2)

    def test_whole_batch_mean_passes(self):
        v = self.judge([0.2] * 5)
        self.assertTrue(v["passed"], v["message"])
        self.assertLessEqual(v["ratio"], 1)
        self.assertFalse(v["weights_differ"])

    def test_per_rank_means_fail_with_their_weights(self):
        v = self.judge([1 / 6] * 3 + [1 / 4] * 2)  # each rank's mean, averaged over 2 ranks
        self.assertFalse(v["passed"])
        self.assertTrue(v["weights_differ"])
        self.assertIn("rank 0 (3 examples) 1/6; rank 1 (2 examples) 1/4", v["message"])

    def test_a_gradient_scaled_as_a_whole_says_so(self):
        v = self.judge([1.0] * 5)  # summed, not averaged
        self.assertFalse(v["passed"])
        self.assertIn("every example weighs 1 where the whole batch's mean weighs each 1/5: the gradient is "
                      "scaled as a whole", v["message"])

    def test_one_example_dropped_fails(self):
        v = self.judge([0.25] * 4 + [0.0])
        self.assertFalse(v["passed"])

    def test_outside_the_family_is_not_judged(self):
        cases = [
            (torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False)), "has no bias"),
            (torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU(), torch.nn.Linear(2, 2)), "GELU"),
            (torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), "ends in an activation"),
            (torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2), torch.nn.Tanh(),
                                 torch.nn.Linear(2, 2)), "activations differ"),
            (torch.nn.Linear(2, 2), "not an nn.Sequential"),
            (torch.nn.Sequential(torch.nn.Linear(2, 2).double()), "torch.float64"),
        ]
        for module, reason in cases:
            fam, why = dtorch.model_family(module)
            self.assertIsNone(fam)
            self.assertIn(reason, why)

    def test_monitor_without_a_loss_says_not_judged(self):
        out = _Lines()
        m = dtorch.Monitor(self.model, None, gradient_every=1, out=out)
        self.model(self.x)
        m.step(self.x, self.y)
        m.close()
        self.assertIn("gradient not judged: no loss named", out.text)

    def test_monitor_judges_a_single_process_step(self):
        out = _Lines()
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        m = dtorch.Monitor(self.model, opt, loss="mse", gradient_every=1, out=out)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
            opt.step()
            m.step(self.x, self.y)
        m.close()
        self.assertIn("2 gradient checks", out.text)
        self.assertEqual(m.failures, [])

    def test_monitor_judges_cross_entropy(self):
        out = _Lines()
        labels = torch.tensor([0, 1, 1, 0, 1])
        m = dtorch.Monitor(self.model, None, loss=torch.nn.CrossEntropyLoss(), gradient_every=1, out=out)
        self.model.zero_grad()
        torch.nn.functional.cross_entropy(self.model(self.x), labels).backward()
        m.step(self.x, labels)
        m.close()
        self.assertIn("1 gradient check,", out.text)
        self.assertNotIn("not judged", out.text)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            dtorch.Monitor(self.model, gradient_every=-1)
        with self.assertRaises(TypeError):
            dtorch.Monitor("model")
        with self.assertRaises(ValueError):
            _core.judge_gradient([3, 4, 2], "tanh", "mse", self.params, [], self.gradient([0.2] * 5), 2)
        with self.assertRaises(ValueError):
            _core.judge_gradient([3, 4, 2], "gelu", "mse", self.params, [], self.gradient([0.2] * 5), 2)


class Records(unittest.TestCase):
    """optimizer_spec (what a record says of the optimizer), and the Monitor's record= and bundle_dir=
    in one process: what a step leaves on disk, and what is refused before anything is written."""

    def setUp(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        self.x = torch.randn(5, 3)
        self.y = torch.randn(5, 2)
        self.tmp = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def test_optimizer_spec(self):
        p = list(self.model.parameters())
        self.assertEqual(dtorch.optimizer_spec(torch.optim.SGD(p, lr=0.5)), {"name": "SGD", "kind": "sgd", "lr": 0.5})
        self.assertEqual(dtorch.optimizer_spec(torch.optim.SGD(p, lr=0.5, momentum=0.9))["kind"], "momentum")
        adam = dtorch.optimizer_spec(torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-6))
        self.assertEqual((adam["kind"], adam["beta1"], adam["beta2"], adam["eps"]), ("adam", 0.8, 0.99, 1e-6))
        refused = [
            (torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "Nesterov"),
            (torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1), "dampening"),
            (torch.optim.SGD(p, lr=0.1, weight_decay=1e-4), "weight decay"),
            (torch.optim.Adam(p, lr=0.1, amsgrad=True), "amsgrad"),
            (torch.optim.AdamW(p, lr=0.1), "weight decay"),
            (torch.optim.RMSprop(p, lr=0.1), "RMSprop"),
            (torch.optim.SGD([{"params": p[:2]}, {"params": p[2:]}], lr=0.1), "2 param groups"),
            (None, "no optimizer"),
        ]
        for opt, reason in refused:
            spec = dtorch.optimizer_spec(opt)
            self.assertIsNone(spec["kind"], reason)
            self.assertIn(reason, spec["not_judged"])

    def train(self, monitor, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(self.model(self.x), self.y).backward()
            opt.step()
            monitor.step(self.x, self.y)
        monitor.close()

    def test_a_record_holds_every_step_and_its_continuity(self):
        opt = torch.optim.Adam(self.model.parameters(), lr=0.01)
        rec = os.path.join(self.tmp, "rec")
        self.train(dtorch.Monitor(self.model, opt, loss="mse", record=rec, out=_Lines()), opt, 3)
        self.assertEqual(sorted(os.listdir(rec)), ["record.json", "step-00000000", "step-00000001", "step-00000002"])
        head = _json(os.path.join(rec, "record.json"))
        self.assertEqual((head["world_size"], head["model"]["dims"], head["model"]["names"]), (1, [3, 4, 2], ["0", "2"]))
        self.assertEqual(head["optimizer"]["kind"], "adam")
        self.assertNotIn("failure", head)
        s1 = os.path.join(rec, "step-00000001")
        step = _json(os.path.join(s1, "step.json"))
        self.assertEqual((step["optimizer_steps"], step["parts"]), (1, [{"rank": 0, "examples": 5}]))
        n = 3 * 4 + 4 + 4 * 2 + 2
        for name, shape in (("params", (n,)), ("grad", (n,)), ("params_after", (n,)), ("state", (2 * n,)),
                            ("x", (5, 3)), ("y", (5, 2))):
            self.assertEqual(np.load(os.path.join(s1, name + ".npy")).shape, shape, name)
        # Each step starts where the one before it ended, state included.
        s0 = os.path.join(rec, "step-00000000")
        np.testing.assert_array_equal(np.load(os.path.join(s0, "params_after.npy")), np.load(os.path.join(s1, "params.npy")))
        np.testing.assert_array_equal(np.load(os.path.join(s0, "state_after.npy")), np.load(os.path.join(s1, "state.npy")))
        self.assertFalse(np.array_equal(np.load(os.path.join(s1, "params.npy")), np.load(os.path.join(s1, "params_after.npy"))))

    def test_a_failed_step_leaves_one_bundle_with_its_failure(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        m = dtorch.Monitor(self.model, opt, loss="mse", gradient_every=1, bundle_dir=self.tmp, out=_Lines())
        opt.zero_grad()
        (torch.nn.functional.mse_loss(self.model(self.x), self.y) * 3).backward()  # a loss scaled by mistake
        opt.step()
        with self.assertRaises(dtorch.CheckFailed):
            m.step(self.x, self.y)
        self.assertEqual(os.listdir(self.tmp), ["dpcheck-bundle-step-00000000"])
        head = _json(os.path.join(self.tmp, "dpcheck-bundle-step-00000000", "record.json"))
        self.assertEqual((head["failure"]["kind"], head["failure"]["step"]), ("gradient", 0))
        step = _json(os.path.join(self.tmp, "dpcheck-bundle-step-00000000", "step-00000000", "step.json"))
        self.assertEqual(step["failure"]["kind"], "gradient")

    def test_refusals_leave_nothing(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        os.mkdir(os.path.join(self.tmp, "old"))
        open(os.path.join(self.tmp, "afile"), "w").close()
        cases = [
            (dict(record=os.path.join(self.tmp, "old")), "it exists"),
            (dict(record=os.path.join(self.tmp, "no", "rec")), "No such file"),
            (dict(bundle_dir=os.path.join(self.tmp, "missing")), "not a directory"),
            (dict(bundle_dir=os.path.join(self.tmp, "afile")), "not a directory"),
            (dict(record=os.path.join(self.tmp, "r"), loss=None), "no loss named"),
        ]
        for kwargs, reason in cases:
            args = dict(loss="mse", out=_Lines())
            args.update(kwargs)
            with self.assertRaises(ValueError) as e:
                dtorch.Monitor(self.model, opt, **args)
            self.assertIn(reason, str(e.exception))
        with self.assertRaises(ValueError) as e:
            bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
            dtorch.Monitor(bn, opt, loss="mse", record=os.path.join(self.tmp, "r"), out=_Lines())
        self.assertIn("BatchNorm1d", str(e.exception))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["afile", "old"])
        self.assertEqual(os.listdir(os.path.join(self.tmp, "old")), [])


def _json(path):
    with open(path) as f:
        return json.load(f)


class _Lines:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


if __name__ == "__main__":
    unittest.main()
