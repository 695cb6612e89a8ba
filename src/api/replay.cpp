// placeholder: implemented by the replay work
#include "smla/replay.h"
namespace smla {
st::File replay(const st::File&, const ReplayOptions&) { fail("replay: not implemented yet"); }
}  // namespace smla
