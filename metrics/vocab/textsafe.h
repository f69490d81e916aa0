/* Text from files shown on a terminal, and output files written whole.
 *
 * probe_tesc(s): s as a terminal shows it safely: control characters (C0,
 * DEL, C1), the bidirectional overrides and invalid UTF-8 written as visible
 * escapes (\n \r \t \x1b \xNN; a C1 or bidi character as the \xNN of its
 * bytes); valid printable UTF-8 unchanged. The result lives in one of 16
 * per-thread buffers, reused by the 16th call after it; NULL gives "(null)".
 *
 * probe_outfile: an output file written to a temporary file in the target's
 * directory (mkstemp, the target's mode, or 0666 minus the umask for a new
 * file), fsync'd and renamed over the target, so the target holds either its
 * earlier bytes or the complete new ones. "-" is stdout (a stream); an
 * existing target that is not a regular file (/dev/null, a FIFO) is written
 * in place; a symbolic link is written through: its final target is replaced
 * atomically and the link is kept (a dangling link is refused). */
#ifndef PROBE_TEXTSAFE_H
#define PROBE_TEXTSAFE_H

#include <stdio.h>

const char *probe_tesc(const char *s);
/* The same into dst (cap bytes, always terminated; cut at a whole escape):
 * the length written. No allocation. */
size_t probe_tesc_to(char *dst, size_t cap, const char *s);

typedef struct {
    FILE *f;           /* write here; NULL after commit/abort */
    int is_stream;     /* stdout or a non-regular file: no temporary file */
    char *target;      /* the file replaced (a symlink's final target) */
    char *tmp;         /* the temporary file, NULL when is_stream */
    char err[512];     /* the reason of a failed open or commit, one line */
} probe_outfile;

/* 0, or -1 with o->err set (nothing created). */
int probe_outfile_open(probe_outfile *o, const char *path);
/* Flush, fsync, close and rename over the target: 0, or -1 with o->err set,
 * the temporary file removed and the target untouched. */
int probe_outfile_commit(probe_outfile *o);
/* Close and remove the temporary file; the target is untouched. */
void probe_outfile_abort(probe_outfile *o);

/* Whether path can be written, for a tool to ask before its work rather
 * than after it: 0 for "-", for an existing target that is not a regular
 * file (written in place, never opened here: a FIFO would block), and when
 * a temporary file can be created next to the target (it is removed at
 * once); else -1 with o->err set, the same line probe_outfile_open gives.
 * Nothing is left behind either way. */
int probe_outfile_check(probe_outfile *o, const char *path);

/* For writers that open a path themselves (HDF5): a new empty temporary
 * file next to path's target, its name in o->tmp (o->f is NULL). Then
 * probe_outfile_commit_path() fsyncs it and renames it over the target. */
int probe_outfile_reserve(probe_outfile *o, const char *path);
int probe_outfile_commit_path(probe_outfile *o);

#endif
