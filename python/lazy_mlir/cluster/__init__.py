"""What joins a fusion group and where groups are cut.

``compilable`` classifies each TorchScript node for the C++ clusterer
(compute, plumbing, or left in TorchScript) and says when nothing compiles
(a first-step setup graph); ``layer_groups`` cuts a step's graph into one
group per repeated layer. May import: observe, config and the C++
extension.
"""
