// nexar — umbrella header.
#pragma once

#include <nexar/communicator.hpp>
#include <nexar/config.hpp>
#include <nexar/dtype.hpp>
#include <nexar/error.hpp>
#include <nexar/request.hpp>
