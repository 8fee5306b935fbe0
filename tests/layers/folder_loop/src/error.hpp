// A planted tree for Layers.AFolderLoopFails: src/ (the base) includes src/io/, which includes src/.
// No two files include each other, so only the folders loop.
#pragma once
