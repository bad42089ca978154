/* one_line: error messages are one line, but names read from files (tensor names in a
 * checkpoint) may hold any byte. Control characters become '?'. */
#ifndef STEPSCOPE_ONE_LINE_H
#define STEPSCOPE_ONE_LINE_H

static inline void one_line(char *msg) {
    for (; *msg; msg++)
        if ((unsigned char)*msg < 0x20 || *msg == 0x7f) *msg = '?';
}

#endif
