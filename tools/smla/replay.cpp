// placeholder: implemented by the replay work (see include/smla/replay.h)
#include "cli.h"
#include "smla/types.h"
namespace smla::cli {
int cmd_replay(const Args&) { fail("smla replay is not implemented yet"); }
}  // namespace smla::cli
