// qknorm's public header for the tensor engine: tensors, autograd and the ops.
//
// Installed as <qk/qk.h> (`pkg-config --cflags --libs qk`). The nn layer (modules, the QK-norm
// GPT, optimisers, data, the trainer) is <qk/nn.h>, which includes this one. Kept apart so that
// including qk.h brings none of the nn layer's names: under `using namespace qk::nn` a program's
// own `Variant` would clash with qk::nn::Variant (nn/lab/sweep.h), a part it never asked for.
// Together they gather every installed header; a program may also include only the parts it uses,
// e.g. <qk/nn/model/gpt.h>. The headers left out of the install (the kernels' helpers, cuda/) are
// internal and not reached from either.
#pragma once

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/bfloat16.h"
#include "core/distributed.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/float16.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/shape.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/fp8.h"
#include "ops/glu.h"
#include "ops/join.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/rope.h"
#include "ops/softmax.h"
