// qknorm's public header: everything a program needs.
#pragma once

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "core/factory.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/join.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
