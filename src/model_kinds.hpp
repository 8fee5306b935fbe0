// The kinds a model is made of: its activation between layers and its loss. Below the model
// (src/train/model.hpp) so that the kernel plugin's contract (src/plugin/kernel_plugin.hpp), which runs
// them, needs nothing else of the model.
#pragma once

#include <string_view>

namespace dpcheck {

enum class Activation { relu, tanh, identity };
enum class Loss { mse, cross_entropy };

std::string_view activation_name(Activation a);
std::string_view loss_name(Loss l);
Activation parse_activation(std::string_view name);  // relu | tanh | identity; else UsageError
Loss parse_loss(std::string_view name);              // mse | cross-entropy; else UsageError

}  // namespace dpcheck
