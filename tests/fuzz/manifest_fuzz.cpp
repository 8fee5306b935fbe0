// libFuzzer target for the checkpoint manifest (src/train/writer.hpp): the input is a step directory's
// manifest.json, beside the parameter and optimizer files of a real checkpoint (checkpoint/, from
// `dpcheck train --model 3,4,2 --optimizer adam --steps 2 --batch 4 --checkpoint-dir DIR`; its manifest
// is corpus/manifest/real-adam). read_checkpoint refuses a bad manifest by returning nothing with a
// reason; it must never throw. A checkpoint it accepts holds one parameter per element of the model and
// one per element for each optimizer state it names. The text alone also goes through parse_manifest,
// which must accept it or refuse it with a UsageError, and agree with read_checkpoint: a manifest the
// reader accepts parses.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "src/error.hpp"
#include "src/train/model.hpp"
#include "src/train/writer.hpp"
#include "tests/fuzz/fuzz_support.hpp"

namespace {

// The model of the checkpoint in checkpoint/.
dpcheck::ModelConfig fixture_model() {
  dpcheck::ModelConfig model;
  model.dims = {3, 4, 2};
  return model;
}

// A step directory holding copies of the checkpoint's files, made once per process.
std::filesystem::path step_dir() {
  static const dpcheck::fuzz::ScratchDir dir;
  static const std::filesystem::path step = [] {
    const std::filesystem::path p = dir.path() / "step-00000002";
    std::filesystem::create_directory(p);
    for (const auto& entry : std::filesystem::directory_iterator(DPCHECK_FUZZ_CHECKPOINT)) {
      if (entry.path().extension() == ".npy") std::filesystem::copy_file(entry.path(), p / entry.path().filename());
    }
    return p;
  }();
  return step;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const dpcheck::ModelConfig model = fixture_model();
  static const std::size_t params = dpcheck::ParamLayout(model).size();
  const std::filesystem::path step = step_dir();
  dpcheck::fuzz::write_input(step / "manifest.json", data, size);
  bool parses = true;
  try {
    dpcheck::parse_manifest(dpcheck::fuzz::as_text(data, size));
  } catch (const dpcheck::UsageError&) {
    parses = false;  // the documented refusal
  }
  std::string why;
  const std::optional<dpcheck::Checkpoint> c = dpcheck::read_checkpoint(step, model, &why);
  if (c) DPCHECK_FUZZ_CHECK(parses);
  if (!c) {
    DPCHECK_FUZZ_CHECK(!why.empty());
    return 0;
  }
  DPCHECK_FUZZ_CHECK(c->params.size() == params);
  DPCHECK_FUZZ_CHECK(c->optimizer_state.size() == c->state_names.size() * params);
  return 0;
}
