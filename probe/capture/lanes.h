/* probe/capture/lanes.h - the raw files of a capture written with
 * probe_writer_set_raw_files: <capture>.raw/00 .. NN, one per lane, and the
 * threads that write a streamed part's pieces to several of them at once
 * (docs/file-format.md "Raw files"). Internal to libprobe. */
#ifndef PROBE_CAPTURE_LANES_H
#define PROBE_CAPTURE_LANES_H

#include <stddef.h>
#include <stdint.h>

#include "probe/capture.h"

#define PROBE_LANES_API __attribute__((visibility("hidden")))

/* Suffix of the folder that holds the raw files, next to the capture. */
#define PROBE_RAW_SUFFIX ".raw"

/* One piece of a tensor's bytes in a raw file: `size` bytes at byte
 * `offset` of lane file `lane`. A tensor's pieces, in order, are its bytes. */
typedef struct probe_raw_seg {
    uint32_t lane;
    uint64_t offset, size;
} probe_raw_seg;

/* 1 when name is a raw file's name as probe writes it into a dataset's
 * external storage list: "<folder>.raw/NN", where <folder> holds no '/'
 * and NN is two decimal digits below PROBE_RAW_FILES_MAX; *dir_len is then
 * the length of "<folder>.raw" and *lane NN. */
PROBE_LANES_API int probe_raw_name_parse(const char *name, size_t *dir_len, unsigned *lane);

/* The pieces of the dataset whose creation properties are dcpl, when its
 * external storage list is probe's raw files: every name parses
 * (probe_raw_name_parse) with the same folder, every piece has a finite
 * size. Returns 1 with *segs malloc'd (*nsegs entries; segs NULL: the list
 * is only checked) and the folder's name in dir (dir_cap bytes); 0 when the dataset has no external storage; -1
 * when the list is not probe's (dir then holds the first name, shown safe to
 * print), -2 on ENOMEM. Call inside H5E_BEGIN_TRY. */
PROBE_LANES_API int probe_raw_efl_read(long long dcpl, char *dir, size_t dir_cap,
                                       probe_raw_seg **segs, size_t *nsegs);

typedef struct probe_lanes probe_lanes;

/* Open k raw files (1 <= k <= PROBE_RAW_FILES_MAX) in <capture_path>.raw/,
 * creating the folder (mode 0777 less the umask) when it is missing. The
 * folder must not be a symbolic link and each file is opened without
 * following one. append 0: each file is created or cut to 0 bytes; append 1:
 * kept, new bytes go after its end. PROBE_EIO naming the folder or file and
 * errno's text; PROBE_ENOMEM. */
PROBE_LANES_API probe_status probe_lanes_open(const char *capture_path, unsigned k, int append,
                                              probe_lanes **out);
PROBE_LANES_API unsigned probe_lanes_count(const probe_lanes *l);
/* "<capture base name>.raw/NN": the name lane i's file has in an external
 * storage list (relative to the capture's folder). */
PROBE_LANES_API const char *probe_lanes_name(const probe_lanes *l, unsigned i);
/* The descriptor of lane i's file. */
PROBE_LANES_API int probe_lanes_fd(const probe_lanes *l, unsigned i);

/* The pieces of a new tensor of nbytes (> 0) bytes, striped over the lanes
 * in turn from lane `first` (mod k) in pieces of `stripe` bytes (the last
 * one shorter); each lane's space is taken from its end. *segs is malloc'd
 * (*nsegs entries). PROBE_ENOMEM; PROBE_EINVAL when stripe is 0. */
PROBE_LANES_API probe_status probe_lanes_place(probe_lanes *l, uint64_t nbytes, uint64_t stripe,
                                               unsigned first, probe_raw_seg **segs,
                                               size_t *nsegs);
/* Give back the space of the last placement (a put that was cancelled; the
 * writer has one put open at a time, so nothing was placed after it). */
PROBE_LANES_API void probe_lanes_unplace(probe_lanes *l);

/* pwrite(2) all n bytes of src at byte off of fd, again after EINTR and
 * short writes: 0, or the errno (ENOSPC for a write of 0 bytes). */
PROBE_LANES_API int probe_pwrite_all(int fd, const void *src, size_t n, uint64_t off);

/* Write bytes [at, at + len) of a tensor whose pieces are segs[0..nsegs)
 * from src: each lane's share on a thread of that lane, the caller's thread
 * taking lane segs' first piece. Returns when every write has finished: 0,
 * or the errno of the first that failed (ENOSPC for a write of 0 bytes);
 * EINVAL when the range passes the pieces' end. In a child of a fork (the
 * threads do not exist there) the caller writes everything itself. */
PROBE_LANES_API int probe_lanes_write(probe_lanes *l, const probe_raw_seg *segs, size_t nsegs,
                                      uint64_t at, const void *src, size_t len);

/* Stop the threads and close the files (NULL: nothing). */
PROBE_LANES_API void probe_lanes_close(probe_lanes *l);

#endif
