// Whole-process dumps on demand: SIGUSR1 makes this process write what each of its ranks'
// watchdogs knows (every communicator's recorder, its pending sends and receives, and
// what the rank is doing) to one JSON file, $NEXAR_DUMP_DIR/nexar-dump-<pid>.json (the
// system's temporary directory when unset), written whole under another name and then
// renamed, so a reader never sees half of it. nexar-run --dump sends the signal to every
// rank and merges the files; any launcher can send it to the ranks itself.
//
// The handler is installed when the first watchdog registers, and only if the process
// left SIGUSR1 at its default action (which would end it): a handler of the application's
// own is never replaced. The handler only writes a byte to a pipe; a thread of the
// process (started with the handler, kept for the process's life) writes the file.
#pragma once

#include <string>

namespace nexar::detail {

class Watchdog;

/// Makes `w` part of the dumps until remove_from_dumps(w) (its destructor).
void add_to_dumps(const Watchdog* w);
void remove_from_dumps(const Watchdog* w);

/// The dump this process would write now (what the signal's thread writes).
std::string process_dump();

}  // namespace nexar::detail
