#pragma once

#include "src/io/files.hpp"
