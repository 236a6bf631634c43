// HostGenerator: on the CPU, a lazy step's draws take their numbers from
// the default generator when its graph runs; eager PyTorch's when each op
// is called. The numbers agree only if nothing else uses that generator in
// between: a draw on the host after the step's first traced draw
// (LayerDrop's torch.rand([]), a batch sampled with torch.randint after
// the forward, an op run eagerly that draws), or torch.manual_seed or
// set_rng_state mid-step. Then every later draw of the step takes other
// numbers than eager's, equally random but silently unlike the reference.
//
// The generator's state is noted when the first draw after a graph that
// draws is traced, and compared when the next graph that draws is about to
// run: a difference is reported (metrics, a warning), not mended (the host
// draws were taken already). On a GPU the draws are the CUDA generator's:
// nothing to compare.
#pragma once

namespace lazy_mlir {

// A draw was traced (a random op's Lazy kernel, a captured region that draws).
void noteDrawTraced();

// Whether the CPU generator's state differs from the one noted at the first
// draw traced since the last graph that drew.
bool hostGeneratorMoved();

// A graph that draws is running: the next draw traced notes the state anew.
void forgetHostGenerator();

}  // namespace lazy_mlir
