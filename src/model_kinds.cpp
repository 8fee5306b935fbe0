#include "src/model_kinds.hpp"

#include "src/choice.hpp"

namespace dpcheck {

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::tanh: return "tanh";
    case Activation::identity: return "identity";
  }
  return "?";
}

std::string_view loss_name(Loss l) {
  switch (l) {
    case Loss::mse: return "mse";
    case Loss::cross_entropy: return "cross-entropy";
  }
  return "?";
}

Activation parse_activation(std::string_view name) {
  return parse_choice(name, {Activation::relu, Activation::tanh, Activation::identity}, activation_name, "activation");
}

Loss parse_loss(std::string_view name) {
  return parse_choice(name, {Loss::mse, Loss::cross_entropy}, loss_name, "loss");
}

}  // namespace dpcheck
