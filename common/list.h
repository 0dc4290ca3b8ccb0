/* Intrusive doubly linked lists: PAGODA_LIST_DEFINE(prefix, list_type, node_type) defines
 * prefix_push_back, prefix_push_front and prefix_remove for a list type with members head,
 * tail (node pointers) and count (unsigned), over a node type with members prev and next. The
 * list does not own its nodes; every operation is O(1). Zero-initialised is an empty list. */
#ifndef PAGODA_COMMON_LIST_H
#define PAGODA_COMMON_LIST_H

#include <stddef.h>

#define PAGODA_LIST_DEFINE(prefix, list_type, node_type)                                           \
    static inline void prefix##_push_back(list_type *l, node_type *q)                              \
    {                                                                                              \
        q->next = NULL;                                                                            \
        q->prev = l->tail;                                                                         \
        if (l->tail)                                                                               \
            l->tail->next = q;                                                                     \
        else                                                                                       \
            l->head = q;                                                                           \
        l->tail = q;                                                                               \
        l->count++;                                                                                \
    }                                                                                              \
    static inline void prefix##_push_front(list_type *l, node_type *q)                             \
    {                                                                                              \
        q->prev = NULL;                                                                            \
        q->next = l->head;                                                                         \
        if (l->head)                                                                               \
            l->head->prev = q;                                                                     \
        else                                                                                       \
            l->tail = q;                                                                           \
        l->head = q;                                                                               \
        l->count++;                                                                                \
    }                                                                                              \
    static inline void prefix##_remove(list_type *l, node_type *q)                                 \
    {                                                                                              \
        if (q->prev)                                                                               \
            q->prev->next = q->next;                                                               \
        else                                                                                       \
            l->head = q->next;                                                                     \
        if (q->next)                                                                               \
            q->next->prev = q->prev;                                                               \
        else                                                                                       \
            l->tail = q->prev;                                                                     \
        q->prev = q->next = NULL;                                                                  \
        l->count--;                                                                                \
    }

#endif
