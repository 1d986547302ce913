// nexar — umbrella header: every public header of the library.
#pragma once

#include <nexar/buffer.hpp>
#include <nexar/cluster.hpp>
#include <nexar/collective.hpp>
#include <nexar/communicator.hpp>
#include <nexar/compression.hpp>
#include <nexar/config.hpp>
#include <nexar/dtype.hpp>
#include <nexar/error.hpp>
#include <nexar/recorder.hpp>
#include <nexar/stats.hpp>
#include <nexar/request.hpp>
#include <nexar/rpc.hpp>
#include <nexar/tuning.hpp>
