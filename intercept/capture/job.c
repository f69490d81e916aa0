/* job.c - one tensor job of the writer queue (capture/job.h): the record
 * the writer gets from it. */
#include <string.h>

#include "capture/job.h"

void shim_job_record(const struct shim_job *j, probe_record *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->path = j->path;
    rec->component = j->component;
    rec->slot = j->slot;
    rec->call = j->call;
    rec->step = j->step;
    rec->cfg_branch = j->cfg_branch;
    rec->timestep = j->timestep;
    rec->scope = j->scope;
    rec->device = j->device_name;
    rec->seq = j->seq;
    rec->dtype = j->dtype;
    rec->rank = j->rank;
    rec->shape = j->shape;
    rec->op = j->op;
    rec->parent = j->parent[0] ? j->parent : NULL;
    rec->block = j->block;
    rec->class_name = j->class_name[0] ? j->class_name : NULL;
    rec->module = j->module[0] ? j->module : NULL;
}

