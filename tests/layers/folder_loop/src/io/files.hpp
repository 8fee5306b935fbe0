#pragma once

#include "src/error.hpp"
