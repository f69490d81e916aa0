/* probe/compare/engine.h - the compare engine on captures the caller has
 * already opened (internal to the build tree, not installed): a tool that
 * reads the captures' manifests and recovery state itself opens each file
 * once and hands the same handles to the engine. */
#ifndef PROBE_COMPARE_ENGINE_H
#define PROBE_COMPARE_ENGINE_H

#include "probe/compare.h"
#include "probe/rankset.h"

/* probe_compare_sets on rset and cset, opened by the caller with
 * probe_rankset_open(reference, nrefs) and probe_rankset_open(candidate,
 * ncands) and not yet built: the engine builds them (once) and reads them;
 * the caller closes them after the result is freed or no longer reads them.
 * Results and errors as probe_compare_sets. */
probe_status probe_compare_ranksets(probe_rankset *rset, const char *const *reference,
                                    size_t nrefs, probe_rankset *cset,
                                    const char *const *candidate, size_t ncands,
                                    const probe_compare_opts *opts, probe_compare_result **out);

#endif
