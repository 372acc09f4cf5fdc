// `tandem import MODEL.onnx --out DIR`: a model exported from PyTorch (torch.onnx.export in
// training mode) as DIR/model.json, a tandem spec whose nodes carry the PyTorch modules'
// names, and DIR/weights.safetensors under PyTorch's state-dict names (core/interop/onnx_import.h).
#pragma once

#include "cli/command_line.h"

namespace tandem {

void declare_import(Command& import);

}  // namespace tandem
