"""Packing: pure algorithms on lengths (``algorithms``, ``refine``, ``knapsack``, ``concatenative``,
``modified_ffd``), repeats kept apart (``distinct``), the cost model, cost cap, carried tails and
step schedule of a buffer (``balance``), and encoded sources assembled into rows and batches
(``assemble``)."""

from energon_nemotron.packing.algorithms import best_fit_decreasing, fill_ratio, first_fit_decreasing, first_fit_shuffle
from energon_nemotron.packing.assemble import assemble_row, batch_rows, round_up
from energon_nemotron.packing.concatenative import concatenative
from energon_nemotron.packing.distinct import BufferOverDataWarning, separate_repeats
from energon_nemotron.packing.knapsack import balanced_greedy_knapsack, greedy_knapsack
from energon_nemotron.packing.modified_ffd import modified_first_fit_decreasing
from energon_nemotron.packing.refine import minimum_bin_slack
from energon_nemotron.packing.spec import Packer, TwoBudgetPacker, has_second_budget, register_packer

__all__ = ["first_fit_decreasing", "best_fit_decreasing", "first_fit_shuffle", "balanced_greedy_knapsack",
           "greedy_knapsack", "concatenative", "modified_first_fit_decreasing", "minimum_bin_slack",
           "fill_ratio", "separate_repeats", "BufferOverDataWarning", "assemble_row", "batch_rows", "round_up",
           "Packer", "TwoBudgetPacker", "register_packer", "has_second_budget"]
